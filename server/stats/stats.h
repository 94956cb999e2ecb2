/* General per-thread counters (`stats`). These are not contention sites:
 * each worker writes only its own cache-line aligned block with plain loads
 * and stores, and `stats` sums them. Declared once in the X-macro table,
 * which also names them in the `stats` output. */
#ifndef KV_STATS_H
#define KV_STATS_H

#include <stdint.h>

#include "util.h"

#define KV_THREAD_STATS(X)                                                     \
    X(cmd_get)                                                                 \
    X(cmd_set)                                                                 \
    X(cmd_flush)                                                               \
    X(cmd_touch)                                                               \
    X(get_hits)                                                                \
    X(get_misses)                                                              \
    X(get_expired)                                                             \
    X(get_flushed)                                                             \
    X(delete_misses)                                                           \
    X(delete_hits)                                                             \
    X(incr_misses)                                                             \
    X(incr_hits)                                                               \
    X(decr_misses)                                                             \
    X(decr_hits)                                                               \
    X(cas_misses)                                                              \
    X(cas_hits)                                                                \
    X(cas_badval)                                                              \
    X(touch_hits)                                                              \
    X(touch_misses)                                                            \
    X(bytes_read)                                                              \
    X(bytes_written)                                                           \
    X(total_items)

struct thread_stats {
#define X(name) uint64_t name;
    KV_THREAD_STATS(X)
#undef X
} KV_ALIGNED;

extern struct thread_stats *thread_stats;

static inline void stat_add(uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
}

#define STAT_ADD(field, n) stat_add(&thread_stats[kv_thread_idx].field, (n))
#define STAT_INCR(field) STAT_ADD(field, 1)


int stats_setup(int nthreads);
void stats_teardown(void);
/* The sum over every thread; bytes_read and bytes_written are the core's
 * (conns_io: the core counts its sockets' bytes itself and knows nothing
 * of this table), so those two are never written per thread. */
void stats_sum(struct thread_stats *out);

#endif
