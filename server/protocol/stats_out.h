/* Composes the replies of `stats [group]`. */
#ifndef KV_STATS_OUT_H
#define KV_STATS_OUT_H

#include <stddef.h>
#include <stdint.h>

#include "core/conn.h"

extern uint64_t kv_started_ns; /* monotonic time the server started */

void process_stats(conn *c, const char *group, size_t len);

#endif
