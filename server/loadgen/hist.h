/* kvload's latency histogram: log-linear, HDR style. Values in ns, 2^k
 * buckets each split in 32 linear sub-buckets, so every recorded value is
 * within ~3 % of its bucket. One per thread, merged by adding counts (never
 * by averaging percentiles). */
#ifndef KVLOAD_HIST_H
#define KVLOAD_HIST_H

#include <stdint.h>

#define SUB_BITS 5
#define SUB (1 << SUB_BITS)
#define HBUCKETS (64 * SUB)

struct hist {
    uint64_t count[HBUCKETS];
    uint64_t max;
};

void hist_add(struct hist *h, uint64_t v);
void hist_merge(struct hist *into, const struct hist *h);
/* The q-quantile (0 < q <= 1): the upper edge of its bucket, at most the max. */
uint64_t hist_pct(const struct hist *h, double q);

#endif
