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

int kv_lock_sample = KV_LOCK_SAMPLE_DEFAULT;
__thread struct lock_pending kv_lock_pending;
__thread struct hold_pending kv_hold_pending;
/* one sampler per lock name: a rarely contended lock is paced apart from a hot one,
 * so that its few waits are not drawn as 1 in the hot lock's n */
static __thread struct kv_sampler lock_samplers[LOCK_NAMES_MAX];
static __thread struct kv_sampler hold_samplers[LOCK_NAMES_MAX];

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
    __atomic_fetch_add(&lock_counters[l->id].contended, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&lock_counters[l->id].wait_ns, waited, __ATOMIC_RELAXED);
    /* A long wait always fires (the probe is small beside it, and a rare
     * long wait is named even in a short recording); a shorter one for 1 in
     * kv_lock_sample, or paced when that is 0 (struct kv_sampler). A futex
     * sleep and wake-up takes tens of microseconds, so under contention most
     * waits are of that length: firing for each was most of what an attached
     * kvprof cost the demo's server (docs/record.md, "Overhead"). A wait
     * nested in another pending one (its lock still held) is not sampled:
     * one pending wait per thread. */
    if (unlikely(KVS_LOCK_WAIT_DONE_ENABLED()) && kv_lock_pending.lock == NULL) {
        uint32_t weight = waited >= KV_LOCK_ALWAYS_NS
                              ? 1
                              : sample_weight(&lock_samplers[l->id], (uint32_t)kv_lock_sample);
        if (weight == 0)
            return;
        kv_lock_pending.weight = (int)weight;
        kv_lock_pending.lock = l;
        kv_lock_pending.wait_ns = waited;
    }
}

/* Out of line, so that a probe's user stack names the caller of kv_unlock()
 * as kv_lock_contended()'s names the caller of kv_lock(). */
__attribute__((noinline)) void kv_lock_report(void)
{
    /* a frame of its own (GCC builds this leaf without one), so that the
     * probe's frame-pointer walk goes through the caller of kv_unlock() */
    __asm__ volatile("" : : "r"(__builtin_frame_address(0)));
    kv_lock_t *l = kv_lock_pending.lock;
    uint64_t waited = kv_lock_pending.wait_ns;
    int weight = kv_lock_pending.weight;
    kv_lock_pending.lock = NULL;
    /* in registers: BCC cannot read a USDT argument the compiler left as a
     * thread-local or %rip-relative operand */
    __asm__ volatile("" : "+r"(waited), "+r"(weight));
    KVS_LOCK_WAIT_DONE(l, (char *)lock_names[l->id], waited, weight);
}

/* One acquisition being timed per thread: a lock taken while another's hold
 * is timed is not drawn. */
__attribute__((noinline)) void kv_hold_begin(kv_lock_t *l)
{
    if (kv_hold_pending.lock != NULL)
        return;
    uint32_t weight = sample_weight(&hold_samplers[l->id], (uint32_t)kv_probe_sample);
    if (weight == 0)
        return;
    kv_hold_pending.weight = (int)weight;
    kv_hold_pending.since_ns = now_ns();
    kv_hold_pending.lock = l;
}

/* Out of line and after the release, as kv_lock_report(): the probe's trap
 * is never inside the critical section it measures. */
__attribute__((noinline)) void kv_hold_report(uint64_t released_ns)
{
    __asm__ volatile("" : : "r"(__builtin_frame_address(0)));
    kv_lock_t *l = kv_hold_pending.lock;
    uint64_t held = released_ns - kv_hold_pending.since_ns;
    int weight = kv_hold_pending.weight;
    kv_hold_pending.lock = NULL;
    __asm__ volatile("" : "+r"(held), "+r"(weight));
    KVS_LOCK_HOLD(l, (char *)lock_names[l->id], held, weight);
}

void lock_stats(enum lock_id id, struct lock_stat *out)
{
    out->contended = __atomic_load_n(&lock_counters[id].contended, __ATOMIC_RELAXED);
    out->wait_ns = __atomic_load_n(&lock_counters[id].wait_ns, __ATOMIC_RELAXED);
}
