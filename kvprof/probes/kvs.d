/*
 * The kvs USDT provider: every probe kvcached fires.
 *
 * The header server/build/kvs.h is generated from this file with the
 * systemtap `dtrace -h`, and the semaphores with `dtrace -G`; never edit the
 * generated files. Every probe has an is-enabled semaphore: a detached probe
 * costs one predictable branch, and anything a probe needs that is not free
 * (a clock read, a sampling decision) sits behind that branch.
 *
 * Per-request probes (cmd__*, atomic__sample) fire for a sample of the
 * requests, drawn per worker thread and, for atomic__sample, per site: paced
 * by default (about `kvcached --probe-rate R` firings a second, default 64,
 * whatever the load), or 1 request in N with `--probe-sample N`. Each
 * sampled probe carries its `weight`, the number of events it stands for.
 * The lock__wait__* probes fire only on the contended path (the trylock
 * failed), so an uncontended lock costs nothing extra; lock__wait__done fires for every
 * contended wait of 1,048,576 ns or more and for a sample of the shorter
 * ones (paced, or 1 in N with `--lock-sample N`), after the lock was
 * released. lock__hold is paced over every acquisition, contended or not
 * (detached, it costs an uncontended lock one predictable branch), and
 * fires after the release too.
 *
 * The tables below are defined in kvcached's sources and copied here for a
 * reader of the probes; tests/test_contracts.py checks each copy against
 * its definition, and kvprof reads the opcodes from server/opcodes.h.
 *
 * Opcodes (cmd__* `opcode`, and `stats timings`; server/opcodes.h):
 *   0 get, 1 gets, 2 gat, 3 gats, 4 set, 5 add, 6 replace, 7 append,
 *   8 prepend, 9 cas, 10 delete, 11 incr, 12 decr, 13 touch, 14 flush_all
 * Statuses (cmd__done `status`; enum op_status, server/opcodes.h):
 *   0 ok (hit, stored, deleted, touched), 1 miss / not found,
 *   2 exists (cas mismatch), 3 not stored, 4 error
 * Item delete reasons (item__delete `reason`; server/storage/life.h):
 *   0 delete, 1 expire, 2 evict, 3 replace (overwritten by a store),
 *   4 flush (invalidated by flush_all)
 * Lock names (lock__wait__* `name`; server/core/lock.h):
 *   item_lock, lru, slabs, topkeys, topkeys_thread, connq
 * Site names (atomic__sample `site`; server/stats/sites.c):
 *   collect_timings, on_create_item, on_delete_item, account_memory
 */
provider kvs {
    /**
     * fired when a worker takes ownership of a new client connection
     * @param fd      the connection's socket
     * @param worker  index of the worker thread (kv-worker-N)
     */
    probe conn__open(int fd, int worker);

    /**
     * fired when a connection is closed, by the client, by an error or at
     * shutdown
     * @param fd      the connection's socket
     * @param worker  index of the worker thread
     */
    probe conn__close(int fd, int worker);

    /**
     * fired before a sampled request is executed (one key of a multi-get is
     * one request)
     * @param worker  index of the worker thread
     * @param opcode  see the opcode table above
     * @param key     the key, NOT NUL-terminated (NULL for flush_all)
     * @param keylen  length of key in bytes
     */
    probe cmd__start(int worker, int opcode, char *key, int keylen);

    /**
     * fired after the same sampled request was executed
     * @param worker      index of the worker thread
     * @param opcode      see the opcode table above
     * @param status      see the status table above
     * @param latency_ns  time the request took inside the server
     * @param weight      how many requests this one stands for
     */
    probe cmd__done(int worker, int opcode, int status, uint64_t latency_ns, int weight);

    /**
     * fired when an item is linked into the cache (set, add, replace,
     * append, prepend, cas, incr, decr)
     * @param item  the item's address
     * @param size  bytes the item occupies (header, key and value)
     */
    probe item__create(void *item, uint32_t size);

    /**
     * fired when an item leaves the cache
     * @param item    the item's address
     * @param size    bytes the item occupied
     * @param reason  see the delete reason table above
     */
    probe item__delete(void *item, uint32_t size, int reason);

    /**
     * fired when a lock was found held (trylock failed), before blocking
     * @param lock  the lock's address
     * @param name  the lock's stable name (see the lock names above)
     */
    probe lock__wait__start(void *lock, char *name);

    /**
     * fired for a sample of the contended acquisitions, when the thread
     * releases the lock it waited for (outside the critical section)
     * @param lock     the lock's address
     * @param name     the lock's stable name
     * @param wait_ns  how long the thread waited for it
     * @param weight   how many contended waits this one stands for: 1 for
     *                 a long wait, the sampler's 1 in N for a short one
     */
    probe lock__wait__done(void *lock, char *name, uint64_t wait_ns, int weight);

    /**
     * fired for a sample of all acquisitions of each named lock, contended
     * or not (paced per thread and lock name, or 1 in N with
     * `--probe-sample N`), when the thread has released it: how long it was
     * held. A lock every request takes caps throughput at about
     * 1 / (hold time x acquisitions per request) before anyone waits for it.
     * @param lock     the lock's address
     * @param name     the lock's stable name
     * @param hold_ns  from the acquisition to the start of the release
     * @param weight   how many acquisitions of this lock by this thread it
     *                 stands for
     */
    probe lock__hold(void *lock, char *name, uint64_t hold_ns, int weight);

    /**
     * fired for a sample of the updates of each counter site, shared or
     * per-thread
     * @param counter  address of the word updated (its cache line is what
     *                 bounces between cores in the shared design)
     * @param site     the site's function name
     * @param cycles   TSC cycles the update took, fenced on both sides
     * @param weight   how many updates of this site by this thread it stands for
     */
    probe atomic__sample(void *counter, char *site, uint64_t cycles, int weight);

    /**
     * fired when a `stats` command merged data (per-thread tables and
     * histograms, or the shared ones)
     * @param what  the stats group: general, timings, topkeys, locks, ...
     * @param ns    time the merge took
     */
    probe stats__collect(char *what, uint64_t ns);
};
