#include "core/lock.h"

#include <stdlib.h>

#include "trace.h"

static const char *const lock_names[LOCK_NAMES_MAX] = {
#define X(id, name) [LOCK_##id] = name,
    KV_LOCK_NAMES(X)
#undef X
};

/* Touched on the contended path only, so one shared counter per name is
 * fine: by then the thread is about to sleep on a futex anyway. */
static struct {
    uint64_t contended;
    uint64_t wait_ns;
} KV_ALIGNED lock_counters[LOCK_NAMES_MAX];

void lock_init(kv_lock_t *l, enum lock_id id)
{
    if (pthread_mutex_init(&l->mutex, NULL) != 0)
        abort();
    l->id = id;
}

void lock_destroy(kv_lock_t *l) { pthread_mutex_destroy(&l->mutex); }

const char *lock_name(enum lock_id id) { return lock_names[id]; }

__attribute__((noinline)) void kv_lock_contended(kv_lock_t *l)
{
    const char *name = lock_names[l->id];
    uint64_t t0 = now_ns();
    KVS_LOCK_WAIT_START(l, (char *)name);
    pthread_mutex_lock(&l->mutex);
    uint64_t waited = now_ns() - t0;
    KVS_LOCK_WAIT_DONE(l, (char *)name, waited);
    __atomic_fetch_add(&lock_counters[l->id].contended, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&lock_counters[l->id].wait_ns, waited, __ATOMIC_RELAXED);
}

void lock_stats(enum lock_id id, struct lock_stat *out)
{
    out->contended = __atomic_load_n(&lock_counters[id].contended, __ATOMIC_RELAXED);
    out->wait_ns = __atomic_load_n(&lock_counters[id].wait_ns, __ATOMIC_RELAXED);
}
