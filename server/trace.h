/* The kvs USDT probes (generated from kvprof/probes/kvs.d) and the per-thread
 * sampling of per-request probes. */
#ifndef KV_TRACE_H
#define KV_TRACE_H

#include "kvs.h"
/* Kernels from 6.18 run a uprobe on a 5-byte nop through a fast path (no
 * single-step), cheaper per hit than sdt.h's 1-byte nop (docs/server.md).
 * The macro is expanded at every probe site, so redefining it after sdt.h is
 * enough. */
#undef _SDT_NOP
#define _SDT_NOP .nops 5

#include <stdint.h>

#include "util.h"

/* --probe-rate's default: a paced sampler fires about this many times a
 * second, per thread and per site. kvprof needs no copy of it: every sampled
 * probe says how many events it stands for. */
#define KV_PROBE_RATE_DEFAULT 16
#define KV_PROBE_SAMPLE_DEFAULT 0 /* paced */
extern int kv_probe_rate;   /* paced samplers: firings a second per thread and site (--probe-rate) */
extern int kv_probe_sample; /* per-request probes: 1 request in N (--probe-sample N); 0: paced */

/* Per-thread xorshift64: the sampling intervals' randomness. Seeded from the
 * thread's own TLS address, so every thread has its own sequence. */
static __thread uint64_t sample_rng;

static inline uint32_t sample_random(void)
{
    uint64_t x = sample_rng;
    if (unlikely(x == 0))
        x = (uint64_t)(uintptr_t)&sample_rng * 0x9E3779B97F4A7C15ull | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    sample_rng = x;
    return (uint32_t)(x >> 32);
}

/* A per-thread sampler: sample_weight() is 0 for most calls and, once
 * every n calls on average, the weight of a call that fires: how many calls
 * it stands for. The gap is drawn uniformly from 1 .. 2n-1: a fixed gap of n
 * would alias with any workload whose pattern repeats every n requests (or a
 * divisor of it) -- a pipelined batch of 32 with one set in it, sampled 1 in
 * 64, would see only sets or only gets.
 *
 * With a fixed n (--probe-sample N, --lock-sample N) every firing weighs n.
 * Paced (the default), n doubles or halves after every SAMPLER_BATCH
 * firings, so that the sampler fires about kv_probe_rate times a second
 * whatever the load: what an attached kvprof pays per second stays the same
 * under a heavy load, and a light one still gets samples. A firing weighs
 * the n its gap was drawn with, fixed before the calls it stands for, so
 * the sum of the weights estimates the calls without bias however n moves.
 * The first call fires and weighs 1.
 *
 * Only called behind a probe's _ENABLED() check, so a detached server never
 * pays for it. */
struct kv_sampler {
    uint32_t countdown; /* calls left until the next firing */
    uint32_t n;         /* 1 in n: what the current gap was drawn with; 0 before the first call */
    uint32_t fired;     /* firings since since_ns */
    uint64_t since_ns;
};

#define SAMPLER_BATCH 8
#define SAMPLER_MAX_N (1u << 30)

static inline uint32_t sampler_fire(struct kv_sampler *s, uint32_t fixed)
{
    uint32_t weight = s->n ? s->n : 1;
    uint32_t n = fixed;
    if (n == 0) {
        n = weight;
        uint64_t now = now_ns();
        if (s->fired == 0)
            s->since_ns = now;
        if (++s->fired > SAMPLER_BATCH) {
            uint64_t took = now - s->since_ns;
            uint64_t want = SAMPLER_BATCH * 1000000000ull / (uint64_t)(kv_probe_rate > 0 ? kv_probe_rate : 1);
            if (took < want / 2 && n < SAMPLER_MAX_N)
                n *= 2;
            else if (took > 2 * want && n > 1)
                n /= 2;
            s->fired = 1;
            s->since_ns = now;
        }
    }
    s->n = n;
    s->countdown = n <= 1 ? 1 : 1 + sample_random() % (2 * n - 1);
    return weight;
}

static inline uint32_t sample_weight(struct kv_sampler *s, uint32_t fixed)
{
    if (likely(s->countdown > 1)) {
        --s->countdown;
        return 0;
    }
    return sampler_fire(s, fixed);
}

/* The per-request probes' sampler: 1 in kv_probe_sample, or paced. */
static inline uint32_t sample_tick(struct kv_sampler *s) { return sample_weight(s, (uint32_t)kv_probe_sample); }

#endif
