/* An item's life in the cache: when a linked item is dead (expired, or
 * invalidated by flush_all), and what its linking and unlinking tell the
 * counter sites and the item__create / item__delete probes. */
#ifndef KV_LIFE_H
#define KV_LIFE_H

#include <stdint.h>

#include "storage/item.h"

/* item__delete reasons, as documented in kvprof/probes/kvs.d */
enum delete_reason { DEL_DELETE, DEL_EXPIRE, DEL_EVICT, DEL_REPLACE, DEL_FLUSH };

extern uint64_t items_flush_at; /* ns; 0: no flush pending or done (items_flush) */

/* Why a linked item is no longer valid at `now`, or -1 if it is. */
static inline int dead_reason(const item *it, uint64_t now)
{
    if (it->exp_ns != 0 && it->exp_ns <= now)
        return DEL_EXPIRE;
    uint64_t fa = __atomic_load_n(&items_flush_at, __ATOMIC_RELAXED);
    if (fa != 0 && fa <= now && it->time_ns <= fa)
        return DEL_FLUSH;
    return -1;
}

void on_linked(item *it);
void on_unlinked(item *it, int reason);

#endif
