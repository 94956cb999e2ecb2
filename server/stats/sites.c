#include "stats/sites.h"

#include <stdlib.h>
#include <string.h>

#include "core/lock.h"
#include "trace.h"
#include "util.h"

static const char *const site_functions[SITES_MAX] = {
#define X(id, fn, flag) [SITE_##id] = fn,
    KV_SITES(X)
#undef X
};
static const char *const site_flags[SITES_MAX] = {
#define X(id, fn, flag) [SITE_##id] = flag,
    KV_SITES(X)
#undef X
};

const char *site_function(enum site_id s) { return site_functions[s]; }
const char *site_flag(enum site_id s) { return site_flags[s]; }
const char *site_mode_name(enum site_mode m) { return m == MODE_SHARED ? "shared" : "per-thread"; }

/* Written by the `site` command while workers read it on every update:
 * relaxed atomics, a worker sees a switch at its next update. */
static enum site_mode modes[SITES_MAX];
static int nslots; /* workers + one slot for any other thread */

enum site_mode site_mode(enum site_id s) { return __atomic_load_n(&modes[s], __ATOMIC_RELAXED); }

const char *sites_preset(void)
{
    int shared = 0;
    for (int s = 0; s < SITES_MAX; s++)
        shared += site_mode((enum site_id)s) == MODE_SHARED;
    return shared == SITES_MAX ? "baseline" : shared == 0 ? "fixed" : "custom";
}

static int token_is(const char *s, size_t n, const char *word) { return strlen(word) == n && memcmp(s, word, n) == 0; }

int sites_switch(const char *site, size_t nsite, const char *mode, size_t nmode)
{
    enum site_mode m;
    if (token_is(mode, nmode, site_mode_name(MODE_SHARED)))
        m = MODE_SHARED;
    else if (token_is(mode, nmode, site_mode_name(MODE_PER_THREAD)))
        m = MODE_PER_THREAD;
    else
        return -2;
    int all = token_is(site, nsite, "all"), found = 0;
    for (int s = 0; s < SITES_MAX; s++) {
        int named = token_is(site, nsite, site_functions[s]) || token_is(site, nsite, site_flags[s] + 2) ||
                    (s == SITE_ITEM_COUNTER && token_is(site, nsite, "on_delete_item"));
        if (all || named) {
            __atomic_store_n(&modes[s], m, __ATOMIC_RELAXED);
            found = 1;
        }
    }
    return found ? 0 : -1;
}

/* atomic__sample sites, each with its own per-thread sampler so that a
 * fixed visiting order can never alias with the sampling period, and a
 * paced one fires as often for a rare site as for a frequent one. */
enum sample_site { SAMPLE_TIMINGS, SAMPLE_CREATE, SAMPLE_DELETE, SAMPLE_MEMORY, SAMPLE_SITES };
static __thread struct kv_sampler site_samplers[SAMPLE_SITES];

/* The weight in a register: BCC cannot read a USDT argument the compiler
 * left as a thread-local or %rip-relative operand. */
#define SAMPLED_UPDATE(which, name, addr, update)                              \
    do {                                                                       \
        uint32_t w_;                                                           \
        if (unlikely(KVS_ATOMIC_SAMPLE_ENABLED()) && (w_ = sample_tick(&site_samplers[which])) != 0) { \
            uint64_t t0_ = tsc_begin();                                        \
            update;                                                            \
            uint64_t t1_ = tsc_end();                                          \
            int weight_ = (int)w_;                                             \
            __asm__ volatile("" : "+r"(weight_));                              \
            KVS_ATOMIC_SAMPLE((void *)(addr), (char *)(name), t1_ - t0_, weight_); \
        } else {                                                               \
            update;                                                            \
        }                                                                      \
    } while (0)

/* The shared design: one atomic RMW on a word every thread writes. */
static inline void shared_add(uint64_t *p, uint64_t v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

/* The per-thread design: only the owner writes its slot, so a plain load and
 * store (no lock prefix) suffice; readers load relaxed and sum. */
static inline void local_add(uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
}

static inline uint64_t load(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

/* ---- collect_timings: latency histograms ------------------------------- */

struct hist {
    uint64_t buckets[OPS_MAX][HIST_BUCKETS];
    uint64_t sum_ns[OPS_MAX];
} KV_ALIGNED;

static struct hist *shared_hist;
static struct hist *thread_hist; /* nslots */

static inline unsigned hist_bucket(uint64_t ns) { return ns ? 63u - (unsigned)__builtin_clzll(ns) : 0u; }

__attribute__((noinline)) void collect_timings(enum opcode op, uint64_t ns)
{
    unsigned b = hist_bucket(ns);
    if (site_mode(SITE_TIMINGS) == MODE_SHARED) {
        struct hist *h = shared_hist;
        SAMPLED_UPDATE(SAMPLE_TIMINGS, "collect_timings", &h->buckets[op][b],
                       (shared_add(&h->buckets[op][b], 1), shared_add(&h->sum_ns[op], ns)));
    } else {
        struct hist *h = &thread_hist[kv_thread_idx];
        SAMPLED_UPDATE(SAMPLE_TIMINGS, "collect_timings", &h->buckets[op][b],
                       (local_add(&h->buckets[op][b], 1), local_add(&h->sum_ns[op], ns)));
    }
}

void timings_snapshot(struct timings_snapshot *out)
{
    memset(out, 0, sizeof(*out));
    for (int s = -1; s < nslots; s++) {
        const struct hist *h = s < 0 ? shared_hist : &thread_hist[s];
        for (unsigned op = 0; op < OPS_MAX; op++) {
            for (unsigned b = 0; b < HIST_BUCKETS; b++)
                out->buckets[op][b] += load(&h->buckets[op][b]);
            out->sum_ns[op] += load(&h->sum_ns[op]);
        }
    }
}

/* ---- update_topkeys: Space-Saving top-keys tables ---------------------- */

/* Space-Saving (Metwally et al.): TOPKEYS_TABLE counters; an unseen key
 * takes over the smallest counter and inherits its count as its error. The
 * hashes sit in their own array so the scan touches 8 cache lines. */
struct topkeys_table {
    kv_lock_t lock;
    uint64_t total;
    uint32_t n;
    uint64_t hv[TOPKEYS_TABLE];
    uint64_t count[TOPKEYS_TABLE];
    uint64_t error[TOPKEYS_TABLE];
    uint8_t nkey[TOPKEYS_TABLE];
    char key[TOPKEYS_TABLE][256];
} KV_ALIGNED;

static struct topkeys_table *shared_topkeys;
static struct topkeys_table *thread_topkeys; /* nslots */

long kv_topkeys_hold_ns;

/* --topkeys-hold-ns: spin on the clock, so the thread stays on its CPU
 * holding the lock, as a longer critical section would. */
static void topkeys_hold(void)
{
    uint64_t until = now_ns() + (uint64_t)kv_topkeys_hold_ns;
    while (now_ns() < until)
        __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void update_topkeys(const char *key, size_t nkey, uint64_t hv)
{
    struct topkeys_table *t =
        site_mode(SITE_TOPKEYS) == MODE_SHARED ? shared_topkeys : &thread_topkeys[kv_thread_idx];
    if (nkey > 255)
        nkey = 255;
    kv_lock(&t->lock);
    if (unlikely(kv_topkeys_hold_ns > 0))
        topkeys_hold();
    t->total++;
    uint32_t min = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        if (t->hv[i] == hv && t->nkey[i] == nkey && memcmp(t->key[i], key, nkey) == 0) {
            t->count[i]++;
            kv_unlock(&t->lock);
            return;
        }
        if (t->count[i] < t->count[min])
            min = i;
    }
    uint32_t slot = min;
    if (t->n < TOPKEYS_TABLE) {
        slot = t->n++;
        t->count[slot] = 0;
    }
    t->error[slot] = t->count[slot];
    t->count[slot]++;
    t->hv[slot] = hv;
    t->nkey[slot] = (uint8_t)nkey;
    memcpy(t->key[slot], key, nkey);
    kv_unlock(&t->lock);
}

static int topkey_cmp(const void *a, const void *b)
{
    const struct topkey *x = a, *y = b;
    if (x->count != y->count)
        return x->count < y->count ? 1 : -1;
    return memcmp(x->key, y->key, x->nkey < y->nkey ? x->nkey : y->nkey);
}

size_t topkeys_snapshot(struct topkey *out, size_t max, uint64_t *total, size_t *tracked)
{
    size_t cap = (size_t)(nslots + 1) * TOPKEYS_TABLE, n = 0;
    struct topkey *all = calloc(cap, sizeof(*all));
    *total = 0;
    *tracked = 0;
    if (all == NULL)
        return 0;
    for (int s = -1; s < nslots; s++) {
        struct topkeys_table *t = s < 0 ? shared_topkeys : &thread_topkeys[s];
        kv_lock(&t->lock);
        *total += t->total;
        for (uint32_t i = 0; i < t->n; i++) {
            size_t j = 0;
            while (j < n && !(all[j].hv == t->hv[i] && all[j].nkey == t->nkey[i] &&
                              memcmp(all[j].key, t->key[i], t->nkey[i]) == 0))
                j++;
            if (j == n) {
                all[n].hv = t->hv[i];
                all[n].nkey = t->nkey[i];
                memcpy(all[n].key, t->key[i], t->nkey[i]);
                n++;
            }
            all[j].count += t->count[i];
            all[j].error += t->error[i];
        }
        kv_unlock(&t->lock);
    }
    qsort(all, n, sizeof(*all), topkey_cmp);
    *tracked = n;
    if (n > max)
        n = max;
    memcpy(out, all, n * sizeof(*out));
    free(all);
    return n;
}

/* ---- on_create_item / on_delete_item / account_memory: counters -------- */

struct slot {
    uint64_t v;
} KV_ALIGNED;

static struct slot shared_items, shared_memory;
static struct slot *thread_items, *thread_memory; /* nslots */

__attribute__((noinline)) void on_create_item(void)
{
    if (site_mode(SITE_ITEM_COUNTER) == MODE_SHARED)
        SAMPLED_UPDATE(SAMPLE_CREATE, "on_create_item", &shared_items.v, shared_add(&shared_items.v, 1));
    else {
        uint64_t *p = &thread_items[kv_thread_idx].v;
        SAMPLED_UPDATE(SAMPLE_CREATE, "on_create_item", p, local_add(p, 1));
    }
}

__attribute__((noinline)) void on_delete_item(void)
{
    if (site_mode(SITE_ITEM_COUNTER) == MODE_SHARED)
        SAMPLED_UPDATE(SAMPLE_DELETE, "on_delete_item", &shared_items.v,
                       shared_add(&shared_items.v, (uint64_t)-1));
    else {
        uint64_t *p = &thread_items[kv_thread_idx].v;
        SAMPLED_UPDATE(SAMPLE_DELETE, "on_delete_item", p, local_add(p, (uint64_t)-1));
    }
}

__attribute__((noinline)) void account_memory(int64_t delta)
{
    if (site_mode(SITE_MEMORY_COUNTER) == MODE_SHARED)
        SAMPLED_UPDATE(SAMPLE_MEMORY, "account_memory", &shared_memory.v,
                       shared_add(&shared_memory.v, (uint64_t)delta));
    else {
        uint64_t *p = &thread_memory[kv_thread_idx].v;
        SAMPLED_UPDATE(SAMPLE_MEMORY, "account_memory", p, local_add(p, (uint64_t)delta));
    }
}

/* Slots hold wrapping deltas (a thread may delete what another created), so
 * the sum is exact in two's complement. */
static int64_t sum_slots(const struct slot *shared, const struct slot *slots)
{
    uint64_t v = load(&shared->v);
    for (int s = 0; s < nslots; s++)
        v += load(&slots[s].v);
    return (int64_t)v;
}

int64_t item_objects(void) { return sum_slots(&shared_items, thread_items); }
int64_t mem_accounted(void) { return sum_slots(&shared_memory, thread_memory); }

/* ---- setup ------------------------------------------------------------- */

static void *zalloc(size_t n, size_t size)
{
    void *p = aligned_alloc(KV_CACHELINE, n * size);
    if (p != NULL)
        memset(p, 0, n * size);
    return p;
}

int sites_setup(int nthreads, const enum site_mode m[SITES_MAX])
{
    memcpy(modes, m, sizeof(modes));
    nslots = nthreads + 1;
    shared_hist = zalloc(1, sizeof(struct hist));
    thread_hist = zalloc((size_t)nslots, sizeof(struct hist));
    shared_topkeys = zalloc(1, sizeof(struct topkeys_table));
    thread_topkeys = zalloc((size_t)nslots, sizeof(struct topkeys_table));
    thread_items = zalloc((size_t)nslots, sizeof(struct slot));
    thread_memory = zalloc((size_t)nslots, sizeof(struct slot));
    if (!shared_hist || !thread_hist || !shared_topkeys || !thread_topkeys || !thread_items || !thread_memory)
        return -1;
    lock_init(&shared_topkeys->lock, LOCK_TOPKEYS);
    for (int s = 0; s < nslots; s++)
        lock_init(&thread_topkeys[s].lock, LOCK_TOPKEYS_THREAD);
    return 0;
}

void sites_teardown(void)
{
    if (shared_topkeys != NULL)
        lock_destroy(&shared_topkeys->lock);
    for (int s = 0; thread_topkeys != NULL && s < nslots; s++)
        lock_destroy(&thread_topkeys[s].lock);
    free(shared_hist);
    free(thread_hist);
    free(shared_topkeys);
    free(thread_topkeys);
    free(thread_items);
    free(thread_memory);
    shared_hist = thread_hist = NULL;
    shared_topkeys = thread_topkeys = NULL;
    thread_items = thread_memory = NULL;
}
