/* The kvs USDT probes (generated from probes/kvs.d) and the per-thread
 * sampling of per-request probes. */
#ifndef KV_TRACE_H
#define KV_TRACE_H

#include "kvs.h"
/* Kernels from 6.18 run a uprobe on a 5-byte nop through a fast path (no
 * single-step): 0.48 vs 0.59 us per hit measured here. The macro is expanded
 * at every probe site, so redefining it after sdt.h is enough. */
#undef _SDT_NOP
#define _SDT_NOP .nops 5

#include <stdint.h>

#include "util.h"

extern int kv_probe_sample; /* fire per-request probes for 1 request in N */

/* Per-thread countdown: true on the first call and then once every
 * kv_probe_sample calls. Only called behind a probe's _ENABLED() check, so a
 * detached server never pays for it. */
static inline int sample_tick(uint32_t *countdown)
{
    if (likely(*countdown > 1)) {
        --*countdown;
        return 0;
    }
    *countdown = (uint32_t)kv_probe_sample;
    return 1;
}

#endif
