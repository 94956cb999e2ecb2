/* The kvs USDT probes (generated from probes/kvs.d) and the per-thread
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

/* --probe-sample's default. kvprof assumes the same for a kvcached started
 * without --probe-sample (it reads the rate from the command line): change
 * both together. */
#define KV_PROBE_SAMPLE_DEFAULT 4096
extern int kv_probe_sample; /* fire per-request probes for 1 request in N */

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

/* Per-thread countdown: true on the first call, then once every n calls on
 * average. The gap is drawn uniformly from
 * 1 .. 2N-1: a fixed gap of N would alias with any workload whose pattern
 * repeats every N requests (or a divisor of it) -- a pipelined batch of 32
 * with one set in it, sampled 1 in 64, would see only sets or only gets.
 * Only called behind a probe's _ENABLED() check, so a detached server never
 * pays for it. */
static inline int sample_every(uint32_t *countdown, uint32_t n)
{
    if (likely(*countdown > 1)) {
        --*countdown;
        return 0;
    }
    *countdown = n <= 1 ? 1 : 1 + sample_random() % (2 * n - 1);
    return 1;
}

/* The per-request probes' countdown: 1 in kv_probe_sample. */
static inline int sample_tick(uint32_t *countdown) { return sample_every(countdown, (uint32_t)kv_probe_sample); }

#endif
