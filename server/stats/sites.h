/* The four contention sites of the Couchbase study, each switchable between
 * the contended design (`shared`) and the fixed one (`per-thread`).
 *
 * Each site is a real, non-inlined function with exactly the name the
 * hotspot catalog and the stacks use. Counter sites fire atomic__sample for
 * a sample of their updates, with the address of the word they updated and
 * the TSC cycles the update took. */
#ifndef KV_SITES_H
#define KV_SITES_H

#include <stddef.h>
#include <stdint.h>

#include "opcodes.h"

enum site_mode { MODE_SHARED = 0, MODE_PER_THREAD = 1 };

#define KV_SITES(X)                                                            \
    X(TIMINGS, "collect_timings", "--timings")                                 \
    X(TOPKEYS, "update_topkeys", "--topkeys")                                  \
    X(ITEM_COUNTER, "on_create_item", "--item-counter")                        \
    X(MEMORY_COUNTER, "account_memory", "--memory-counter")

enum site_id {
#define X(id, fn, flag) SITE_##id,
    KV_SITES(X)
#undef X
    SITES_MAX
};

#define HIST_BUCKETS 64
#define TOPKEYS_TABLE 64

const char *site_function(enum site_id s);
const char *site_flag(enum site_id s);
const char *site_mode_name(enum site_mode m);
enum site_mode site_mode(enum site_id s);
/* Busy-wait this many ns inside update_topkeys' critical section, in either
 * mode (--topkeys-hold-ns): the work a slower critical section would do, so
 * that a 2-core machine can reach the ceiling the topkeys mutex puts on
 * throughput. 0 (the default) adds nothing. */
extern long kv_topkeys_hold_ns;
/* "baseline" (every site shared), "fixed" (none) or "custom". */
const char *sites_preset(void);

/* The `site` command: switch a site (by its function's name, on_delete_item
 * naming the item counter too, by its flag without the dashes, or "all") to a mode ("shared", "per-thread")
 * while the server runs. Both designs' data always exist and every reader
 * sums both, so counts stay exact across a switch. 0, or -1 for an unknown
 * site and -2 for an unknown mode (nothing changed). */
int sites_switch(const char *site, size_t nsite, const char *mode, size_t nmode);

int sites_setup(int nthreads, const enum site_mode modes[SITES_MAX]);
void sites_teardown(void);

void collect_timings(enum opcode op, uint64_t ns);
void update_topkeys(const char *key, size_t nkey, uint64_t hv);
void on_create_item(void);
void on_delete_item(void);
void account_memory(int64_t delta);

int64_t item_objects(void);
int64_t mem_accounted(void);

struct timings_snapshot {
    uint64_t buckets[OPS_MAX][HIST_BUCKETS];
    uint64_t sum_ns[OPS_MAX];
};
void timings_snapshot(struct timings_snapshot *out);

struct topkey {
    uint64_t hv;
    uint64_t count;
    uint64_t error;
    uint8_t nkey;
    char key[256];
};
/* Merges every table; fills up to `max` keys, most accessed first, and
 * returns how many. */
size_t topkeys_snapshot(struct topkey *out, size_t max, uint64_t *total, size_t *tracked);

#endif
