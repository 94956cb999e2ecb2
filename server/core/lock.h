/* Named mutexes whose contention is counted and traced.
 *
 * kv_lock() tries the lock first; only when that fails does it go out of line
 * to kv_lock_contended(), which fires lock__wait__start and adds to the
 * per-name counters of `stats locks`. An uncontended lock costs exactly a
 * pthread trylock.
 *
 * lock__wait__done fires for every wait of KV_LOCK_ALWAYS_NS or more and for
 * a sample of the shorter contended waits (per thread, paced or 1 in
 * kv_lock_sample; the probe says how many waits it stands for), and only once
 * the lock is released again: kv_lock_contended() leaves the sampled wait in
 * the thread's kv_lock_pending and kv_unlock() of that lock fires it, so the
 * probe's trap and program never lengthen the critical section a contended
 * lock protects. An unlock costs one thread-local compare more.
 *
 * lock__hold: with the probe attached, kv_lock() draws a paced sample of all
 * acquisitions (per thread and lock name) and notes when the sampled one was
 * acquired; kv_unlock() of that lock reads the clock before releasing it and
 * fires the probe after. A sampled acquisition's hold includes one clock
 * read; the others pay nothing but the draw. Detached, kv_lock() costs one
 * semaphore test more and kv_unlock() a second thread-local compare. */
#ifndef KV_LOCK_H
#define KV_LOCK_H

#include <pthread.h>
#include <stdint.h>

#include "trace.h"
#include "util.h"

#define KV_LOCK_NAMES(X)                                                       \
    X(ITEM, "item_lock")                                                       \
    X(LRU, "lru")                                                              \
    X(SLABS, "slabs")                                                          \
    X(TOPKEYS, "topkeys")                                                      \
    X(TOPKEYS_THREAD, "topkeys_thread")                                        \
    X(CONNQ, "connq")

enum lock_id {
#define X(id, name) LOCK_##id,
    KV_LOCK_NAMES(X)
#undef X
    LOCK_NAMES_MAX
};

typedef struct kv_lock {
    pthread_mutex_t mutex;
    enum lock_id id;
} kv_lock_t;

/* One cache line per lock: striped locks must not falsely share. */
typedef struct kv_padded_lock {
    kv_lock_t lock;
} KV_ALIGNED kv_padded_lock_t;

struct lock_stat {
    uint64_t contended;
    uint64_t wait_ns;
};

/* A sampled contended wait not yet fired: its lock is still held. */
struct lock_pending {
    kv_lock_t *lock;
    uint64_t wait_ns;
    int weight;
};
extern __thread struct lock_pending kv_lock_pending;

/* A sampled acquisition whose hold time is being measured (lock__hold). */
struct hold_pending {
    kv_lock_t *lock;
    uint64_t since_ns;
    int weight;
};
extern __thread struct hold_pending kv_hold_pending;

#define KV_LOCK_SAMPLE_DEFAULT 0 /* paced: see struct kv_sampler in trace.h */
#define KV_LOCK_ALWAYS_NS (1u << 20) /* a wait this long (about 1 ms) always fires lock__wait__done */
extern int kv_lock_sample; /* lock__wait__done for 1 shorter contended wait in N (--lock-sample); 0: paced */

void lock_init(kv_lock_t *l, enum lock_id id);
void lock_destroy(kv_lock_t *l);
void kv_lock_contended(kv_lock_t *l);
void kv_lock_report(void);
void kv_hold_begin(kv_lock_t *l);
void kv_hold_report(uint64_t released_ns);
const char *lock_name(enum lock_id id);
void lock_stats(enum lock_id id, struct lock_stat *out);

static inline void kv_lock(kv_lock_t *l)
{
    if (unlikely(pthread_mutex_trylock(&l->mutex) != 0))
        kv_lock_contended(l);
    if (unlikely(KVS_LOCK_HOLD_ENABLED()))
        kv_hold_begin(l);
}

static inline int kv_trylock(kv_lock_t *l) { return pthread_mutex_trylock(&l->mutex) == 0; }

static inline void kv_unlock(kv_lock_t *l)
{
    if (unlikely(kv_hold_pending.lock == l)) {
        uint64_t released = now_ns();
        pthread_mutex_unlock(&l->mutex);
        kv_hold_report(released);
    } else {
        pthread_mutex_unlock(&l->mutex);
    }
    if (unlikely(kv_lock_pending.lock == l)) {
        kv_lock_report();
        /* no tail call: the caller's frame must stay on the probe's stack */
        __asm__ volatile("" ::: "memory");
    }
}

#endif
