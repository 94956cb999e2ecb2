#include "loadgen/hist.h"

#include <math.h>

static unsigned hist_index(uint64_t v)
{
    if (v < SUB)
        return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    unsigned shift = msb - SUB_BITS;
    return (shift + 1) * SUB + (unsigned)((v >> shift) & (SUB - 1));
}

static uint64_t hist_value(unsigned idx) /* upper edge of a bucket */
{
    if (idx < SUB)
        return idx;
    unsigned shift = idx / SUB - 1;
    uint64_t base = (uint64_t)(SUB + idx % SUB) << shift;
    return base + ((1ull << shift) - 1);
}

void hist_add(struct hist *h, uint64_t v)
{
    h->count[hist_index(v)]++;
    if (v > h->max)
        h->max = v;
}

void hist_merge(struct hist *into, const struct hist *h)
{
    for (unsigned b = 0; b < HBUCKETS; b++)
        into->count[b] += h->count[b];
    if (h->max > into->max)
        into->max = h->max;
}

uint64_t hist_pct(const struct hist *h, double q)
{
    uint64_t total = 0, seen = 0;
    for (unsigned i = 0; i < HBUCKETS; i++)
        total += h->count[i];
    if (total == 0)
        return 0;
    uint64_t rank = (uint64_t)ceil(q * (double)total);
    if (rank == 0)
        rank = 1;
    for (unsigned i = 0; i < HBUCKETS; i++) {
        seen += h->count[i];
        if (seen >= rank) {
            uint64_t v = hist_value(i);
            return v < h->max ? v : h->max;
        }
    }
    return h->max;
}
