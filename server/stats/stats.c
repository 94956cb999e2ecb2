#include "stats/stats.h"

#include <stdlib.h>
#include <string.h>

#include "core/conn.h"

struct thread_stats *thread_stats;
static int nslots;

int stats_setup(int nthreads)
{
    nslots = nthreads + 1;
    thread_stats = aligned_alloc(KV_CACHELINE, (size_t)nslots * sizeof(*thread_stats));
    if (thread_stats == NULL)
        return -1;
    memset(thread_stats, 0, (size_t)nslots * sizeof(*thread_stats));
    return 0;
}

void stats_teardown(void)
{
    free(thread_stats);
    thread_stats = NULL;
}

void stats_sum(struct thread_stats *out)
{
    memset(out, 0, sizeof(*out));
    for (int s = 0; s < nslots; s++) {
#define X(name) out->name += __atomic_load_n(&thread_stats[s].name, __ATOMIC_RELAXED);
        KV_THREAD_STATS(X)
#undef X
    }
    struct conn_io io;
    conns_io(&io);
    out->bytes_read = io.bytes_read;
    out->bytes_written = io.bytes_written;
}
