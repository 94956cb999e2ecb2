#include "protocol/stats_out.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/lock.h"
#include "opcodes.h"
#include "settings.h"
#include "stats/sites.h"
#include "stats/stats.h"
#include "storage/items.h"
#include "storage/slabs.h"
#include "trace.h"

#define TOPKEYS_SHOWN 20

uint64_t kv_started_ns;

static void stat_u64(conn *c, const char *name, uint64_t v) { out_printf(c, "STAT %s %" PRIu64 "\r\n", name, v); }
static void stat_str(conn *c, const char *name, const char *v) { out_printf(c, "STAT %s %s\r\n", name, v); }

static void stats_general(conn *c)
{
    struct thread_stats ts;
    struct items_totals it;
    struct rusage ru;
    stats_sum(&ts);
    items_totals(&it);
    getrusage(RUSAGE_SELF, &ru);
    stat_u64(c, "pid", (uint64_t)getpid());
    stat_u64(c, "uptime", (now_ns() - kv_started_ns) / 1000000000ull);
    stat_u64(c, "time", (uint64_t)time(NULL));
    stat_str(c, "version", KV_PROTOCOL_VERSION);
    stat_u64(c, "pointer_size", sizeof(void *) * 8);
    out_printf(c, "STAT rusage_user %ld.%06ld\r\n", (long)ru.ru_utime.tv_sec, (long)ru.ru_utime.tv_usec);
    out_printf(c, "STAT rusage_system %ld.%06ld\r\n", (long)ru.ru_stime.tv_sec, (long)ru.ru_stime.tv_usec);
    stat_u64(c, "max_connections", (uint64_t)settings.maxconns);
    stat_u64(c, "curr_connections", conns_current());
    stat_u64(c, "total_connections", conns_total());
    stat_u64(c, "rejected_connections", conns_rejected());
#define X(name) stat_u64(c, #name, ts.name);
    KV_THREAD_STATS(X)
#undef X
    stat_u64(c, "limit_maxbytes", settings.maxbytes);
    stat_u64(c, "threads", (uint64_t)settings.nthreads);
    stat_u64(c, "bytes", it.bytes);
    stat_u64(c, "curr_items", it.curr_items);
    stat_u64(c, "evictions", it.evictions);
    stat_u64(c, "reclaimed", it.reclaimed);
    stat_u64(c, "expired_unfetched", it.expired_unfetched);
    out_printf(c, "STAT item_objects %" PRId64 "\r\n", item_objects());
    out_printf(c, "STAT mem_accounted %" PRId64 "\r\n", mem_accounted());
    stat_u64(c, "probe_sample", (uint64_t)settings.probe_sample);
}

static void stats_settings(conn *c)
{
    stat_u64(c, "maxbytes", settings.maxbytes);
    stat_u64(c, "maxconns", (uint64_t)settings.maxconns);
    stat_u64(c, "tcpport", (uint64_t)settings.port);
    stat_str(c, "interface", settings.iface);
    stat_u64(c, "verbosity", (uint64_t)settings.verbose);
    stat_u64(c, "num_threads", (uint64_t)settings.nthreads);
    stat_u64(c, "item_size_max", settings.item_size_max);
    stat_str(c, "evictions", "on");
    stat_str(c, "preset", sites_preset());
    stat_u64(c, "probe_sample", (uint64_t)settings.probe_sample);
    stat_u64(c, "lock_sample", (uint64_t)settings.lock_sample);
    stat_u64(c, "probe_rate", (uint64_t)settings.probe_rate);
    stat_u64(c, "topkeys_hold_ns", (uint64_t)settings.topkeys_hold_ns);
    stat_str(c, "cpu_affinity", settings.ncpus > 0 ? settings.cpu_affinity : "none");
    stat_str(c, "key_compare", key_compare_name(items_key_compare()));
    for (int s = 0; s < SITES_MAX; s++) {
        const char *mode = site_mode_name(site_mode((enum site_id)s));
        stat_str(c, site_function((enum site_id)s), mode);
        if (s == SITE_ITEM_COUNTER)
            stat_str(c, "on_delete_item", mode);
    }
}

static void stats_items(conn *c)
{
    uint64_t now = now_ns();
    for (unsigned i = 1; i <= slabs_nclasses(); i++) {
        slabclass_t *s = slabs_class(i);
        kv_lock(&s->lock);
        uint64_t number = s->curr_items, evicted = s->evicted, reclaimed = s->reclaimed, oom = s->outofmemory;
        uint64_t age = s->tail != NULL && now > s->tail->time_ns ? (now - s->tail->time_ns) / 1000000000ull : 0;
        kv_unlock(&s->lock);
        if (number == 0 && evicted == 0 && oom == 0)
            continue;
        out_printf(c, "STAT items:%u:number %" PRIu64 "\r\n", i, number);
        out_printf(c, "STAT items:%u:age %" PRIu64 "\r\n", i, age);
        out_printf(c, "STAT items:%u:evicted %" PRIu64 "\r\n", i, evicted);
        out_printf(c, "STAT items:%u:reclaimed %" PRIu64 "\r\n", i, reclaimed);
        out_printf(c, "STAT items:%u:outofmemory %" PRIu64 "\r\n", i, oom);
    }
}

static void stats_slabs(conn *c)
{
    unsigned active = 0;
    for (unsigned i = 1; i <= slabs_nclasses(); i++) {
        slabclass_t *s = slabs_class(i);
        kv_lock(&s->lock);
        uint64_t pages = s->pages, total = s->total_chunks, free_chunks = s->free_chunks;
        kv_unlock(&s->lock);
        if (pages == 0)
            continue;
        active++;
        out_printf(c, "STAT %u:chunk_size %u\r\n", i, s->size);
        out_printf(c, "STAT %u:chunks_per_page %u\r\n", i, s->perslab);
        out_printf(c, "STAT %u:total_pages %" PRIu64 "\r\n", i, pages);
        out_printf(c, "STAT %u:total_chunks %" PRIu64 "\r\n", i, total);
        out_printf(c, "STAT %u:used_chunks %" PRIu64 "\r\n", i, total - free_chunks);
        out_printf(c, "STAT %u:free_chunks %" PRIu64 "\r\n", i, free_chunks);
    }
    stat_u64(c, "active_slabs", active);
    stat_u64(c, "slabs_moved", slabs_moved());
    stat_u64(c, "total_malloced", slabs_total_malloced());
}

/* Latency at quantile q from log2 buckets: the upper edge of the bucket the
 * quantile falls in (an over-estimate by less than 2x, never an under). */
static uint64_t hist_quantile(const uint64_t *b, uint64_t count, double q)
{
    uint64_t rank = (uint64_t)(q * (double)count + 0.5), seen = 0;
    if (rank == 0)
        rank = 1;
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        seen += b[i];
        if (seen >= rank)
            return i >= 63 ? UINT64_MAX : (2ull << i) - 1;
    }
    return 0;
}

static void stats_timings(conn *c)
{
    struct timings_snapshot *t = malloc(sizeof(*t));
    if (t == NULL) {
        out_str(c, "SERVER_ERROR out of memory\r\n");
        return;
    }
    timings_snapshot(t);
    uint64_t total = 0;
    for (unsigned op = 0; op < OPS_MAX; op++) {
        uint64_t count = 0;
        for (unsigned b = 0; b < HIST_BUCKETS; b++)
            count += t->buckets[op][b];
        if (count == 0)
            continue;
        const char *name = opcode_name((enum opcode)op);
        total += count;
        out_printf(c, "STAT %s:count %" PRIu64 "\r\n", name, count);
        out_printf(c, "STAT %s:sum_ns %" PRIu64 "\r\n", name, t->sum_ns[op]);
        out_printf(c, "STAT %s:p50_ns %" PRIu64 "\r\n", name, hist_quantile(t->buckets[op], count, 0.50));
        out_printf(c, "STAT %s:p99_ns %" PRIu64 "\r\n", name, hist_quantile(t->buckets[op], count, 0.99));
        out_printf(c, "STAT %s:log2_ns ", name);
        for (unsigned b = 0; b < HIST_BUCKETS; b++)
            out_printf(c, b ? ",%" PRIu64 : "%" PRIu64, t->buckets[op][b]);
        out_str(c, "\r\n");
    }
    stat_u64(c, "total:count", total);
    free(t);
}

static void stats_topkeys(conn *c)
{
    struct topkey *keys = calloc(TOPKEYS_SHOWN, sizeof(*keys));
    uint64_t total;
    size_t tracked;
    if (keys == NULL) {
        out_str(c, "SERVER_ERROR out of memory\r\n");
        return;
    }
    size_t n = topkeys_snapshot(keys, TOPKEYS_SHOWN, &total, &tracked);
    stat_u64(c, "topkeys_total", total);
    stat_u64(c, "topkeys_tracked", tracked);
    for (size_t i = 0; i < n; i++)
        out_printf(c, "STAT topkey:%.*s count=%" PRIu64 ",error=%" PRIu64 "\r\n", (int)keys[i].nkey, keys[i].key,
                   keys[i].count, keys[i].error);
    free(keys);
}

static void stats_locks(conn *c)
{
    for (int id = 0; id < LOCK_NAMES_MAX; id++) {
        struct lock_stat s;
        lock_stats((enum lock_id)id, &s);
        out_printf(c, "STAT %s:contended %" PRIu64 "\r\n", lock_name((enum lock_id)id), s.contended);
        out_printf(c, "STAT %s:wait_ns %" PRIu64 "\r\n", lock_name((enum lock_id)id), s.wait_ns);
    }
}

static const struct {
    const char *name;
    void (*fn)(conn *);
} groups[] = {
    {"settings", stats_settings}, {"items", stats_items},     {"slabs", stats_slabs},
    {"timings", stats_timings},   {"topkeys", stats_topkeys}, {"locks", stats_locks},
};

void process_stats(conn *c, const char *group, size_t len)
{
    const char *what = "general";
    void (*fn)(conn *) = stats_general;
    if (group != NULL) {
        fn = NULL;
        for (size_t i = 0; i < KV_ARRAY_LEN(groups); i++)
            if (strlen(groups[i].name) == len && memcmp(groups[i].name, group, len) == 0) {
                fn = groups[i].fn;
                what = groups[i].name;
            }
        if (fn == NULL) {
            out_str(c, "ERROR\r\n");
            return;
        }
    }
    uint64_t t0 = now_ns();
    fn(c);
    out_str(c, "END\r\n");
    KVS_STATS_COLLECT((char *)what, now_ns() - t0);
}
