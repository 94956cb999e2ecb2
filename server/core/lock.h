/* Named mutexes whose contention is counted and traced.
 *
 * kv_lock() tries the lock first; only when that fails does it go out of line
 * to kv_lock_contended(), which fires lock__wait__start/done and adds to the
 * per-name counters of `stats locks`. An uncontended lock costs exactly a
 * pthread trylock. */
#ifndef KV_LOCK_H
#define KV_LOCK_H

#include <pthread.h>
#include <stdint.h>

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

void lock_init(kv_lock_t *l, enum lock_id id);
void lock_destroy(kv_lock_t *l);
void kv_lock_contended(kv_lock_t *l);
const char *lock_name(enum lock_id id);
void lock_stats(enum lock_id id, struct lock_stat *out);

static inline void kv_lock(kv_lock_t *l)
{
    if (likely(pthread_mutex_trylock(&l->mutex) == 0))
        return;
    kv_lock_contended(l);
}

static inline int kv_trylock(kv_lock_t *l) { return pthread_mutex_trylock(&l->mutex) == 0; }

static inline void kv_unlock(kv_lock_t *l) { pthread_mutex_unlock(&l->mutex); }

#endif
