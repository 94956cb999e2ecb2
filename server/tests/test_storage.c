/* Unit tests of the store, one group per module of storage/: the hash table
 * (hash.c), an item's life (life.c: expiry, flush_all), making room
 * (evict.c: the LRU's CLOCK eviction, a page moved between classes) and the
 * commands' semantics (items.c). Single-threaded, on a small memory limit;
 * run by `make -C server check`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stats/sites.h"
#include "storage/items.h"
#include "storage/life.h"
#include "storage/slabs.h"
#include "tests/check.h"
#include "util.h"

__thread int kv_thread_idx;
int kv_probe_sample = 1;
int kv_probe_rate = 1; /* unused: kv_probe_sample fixes the sampling */

#define MEM (4u << 20)
#define NOW 1000000000000ull /* a monotonic time well past 0 */

static void setup(enum key_compare mode)
{
    static const enum site_mode modes[SITES_MAX] = {MODE_PER_THREAD, MODE_PER_THREAD, MODE_PER_THREAD,
                                                    MODE_PER_THREAD};
    if (sites_setup(1, modes) != 0 || items_setup(MEM, 1u << 20, mode) != 0) {
        fprintf(stderr, "test_storage: setup failed\n");
        exit(1);
    }
}

static void teardown(void)
{
    items_teardown();
    sites_teardown();
}

static uint64_t hv_of(const char *key) { return kv_hash(key, strlen(key)); }

/* Stores key=value with op; the store's result. */
static enum store_result put(const char *key, const char *value, enum store_op op, uint64_t cas, uint64_t exp)
{
    uint32_t n = (uint32_t)strlen(value);
    item *it = items_alloc(key, (uint8_t)strlen(key), 0, exp, n);
    if (it == NULL)
        return STORE_NO_MEMORY;
    memcpy(item_value(it), value, n);
    memcpy(item_value(it) + n, "\r\n", 2);
    return items_store(it, op, cas, hv_of(key), NOW);
}

struct copied {
    char value[1100];
    uint64_t cas;
};

static void copy_out(void *ctx, const item *it)
{
    struct copied *c = ctx;
    size_t n = it->nbytes < sizeof(c->value) - 1 ? it->nbytes : sizeof(c->value) - 1;
    memcpy(c->value, item_cvalue(it), n);
    c->value[n] = '\0';
    c->cas = it->cas;
}

static enum lookup_result get_at(const char *key, uint64_t now, struct copied *out)
{
    return items_get(key, (uint8_t)strlen(key), hv_of(key), now, NULL, copy_out, out);
}

static int has(const char *key, const char *value)
{
    struct copied c;
    return get_at(key, NOW, &c) == LOOKUP_HIT && strcmp(c.value, value) == 0;
}

/* ---- hash.c ---------------------------------------------------------------- */

static void test_hash(enum key_compare mode)
{
    setup(mode);
    static char mem[3][sizeof(item) + 8];
    item *a = (item *)mem[0], *b = (item *)mem[1], *c = (item *)mem[2];
    const char *keys[] = {"ab", "abc", "b"};
    item *items[] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        memset(items[i], 0, sizeof(item));
        items[i]->nkey = (uint8_t)strlen(keys[i]);
        memcpy(item_key(items[i]), keys[i], items[i]->nkey);
        items[i]->hv = 7; /* one bucket: the chain is walked */
        hash_insert(items[i]);
    }
    for (int i = 0; i < 3; i++)
        CHECK(hash_find(keys[i], (uint8_t)strlen(keys[i]), 7) == items[i], key_compare_name(mode));
    CHECK(hash_find("a", 1, 7) == NULL, "a prefix of a key is another key");
    CHECK(hash_find("abcd", 4, 7) == NULL, "a key is not a prefix of a longer one");
    CHECK(hash_find("ab", 2, 8) == NULL, "another bucket");
    hash_remove(b);
    CHECK(hash_find("abc", 3, 7) == NULL && hash_find("ab", 2, 7) == a && hash_find("b", 1, 7) == c,
          "removed from the middle of the chain");
    CHECK(stripe_of(7) == stripe_of(7 + STRIPES) || hash.mask < STRIPES, "stripes repeat");
    CHECK(items_key_compare() == mode, "the mode is the table's");
    hash_remove(a);
    hash_remove(c);
    teardown();
}

/* ---- life.c ---------------------------------------------------------------- */

static void test_life(void)
{
    item it = {.time_ns = NOW - 10};
    CHECK(dead_reason(&it, NOW) == -1, "no expiry, no flush");
    it.exp_ns = NOW;
    CHECK(dead_reason(&it, NOW) == DEL_EXPIRE, "expires at its time");
    it.exp_ns = NOW + 1;
    CHECK(dead_reason(&it, NOW) == -1, "not before");
    items_flush_at = NOW + 5;
    CHECK(dead_reason(&it, NOW) == -1, "a flush still to come");
    CHECK(dead_reason(&it, NOW + 5) == DEL_EXPIRE, "expired and flushed: expiry is the reason");
    it.exp_ns = 0;
    CHECK(dead_reason(&it, NOW + 5) == DEL_FLUSH, "stored before the flush");
    it.time_ns = NOW + 6;
    CHECK(dead_reason(&it, NOW + 7) == -1, "stored after the flush");
    items_flush_at = 0;
}

/* ---- evict.c --------------------------------------------------------------- */

static void test_eviction(void)
{
    setup(KEY_COMPARE_INLINE);
    static char value[1001];
    memset(value, 'v', 1000);
    char key[32];
    int stored = 0;
    for (int i = 0; i < 20000; i++) { /* about 5 times what fits */
        snprintf(key, sizeof(key), "key-%d", i);
        stored += put(key, value, STORE_SET, 0, 0) == STORE_STORED;
        if (i == 10) {
            struct copied c;
            CHECK(get_at("key-0", NOW, &c) == LOOKUP_HIT, "still there early on");
        }
    }
    CHECK(stored == 20000, "every set found room");
    struct items_totals t;
    items_totals(&t);
    CHECK(t.evictions > 0 && t.curr_items < 20000, "the oldest were evicted");
    CHECK(has("key-19999", value), "the newest is there");
    CHECK(!has("key-1", value), "an old one is gone");
    /* A size never seen while memory is full: a page moves to its class. */
    static char big[200001];
    memset(big, 'b', 200000);
    uint64_t moved = slabs_moved();
    CHECK(put("big", big, STORE_SET, 0, 0) == STORE_STORED, "a new size is stored");
    CHECK(slabs_moved() == moved + 1, "by moving a page");
    teardown();
}

/* A page moved to another class counts its expired, never-read items as
 * expired_unfetched, as eviction from the LRU tail does. */
static void test_page_move_counts_expired_unfetched(void)
{
    setup(KEY_COMPARE_INLINE);
    static char value[1001];
    memset(value, 'v', 1000);
    char key[32];
    for (int i = 0; i < 5000; i++) { /* more than fits: memory is full */
        snprintf(key, sizeof(key), "old-%d", i);
        put(key, value, STORE_SET, 0, 1); /* expired from the start, never read */
    }
    struct items_totals before, after;
    items_totals(&before);
    static char big[200001];
    memset(big, 'b', 200000);
    uint64_t moved = slabs_moved();
    CHECK(put("big", big, STORE_SET, 0, 0) == STORE_STORED && slabs_moved() == moved + 1, "a page moved");
    items_totals(&after);
    CHECK(after.expired_unfetched > before.expired_unfetched, "its expired items count as expired_unfetched");
    CHECK(after.reclaimed > before.reclaimed, "and as reclaimed");
    teardown();
}

static void test_second_chance(void)
{
    setup(KEY_COMPARE_INLINE);
    static char value[1001];
    memset(value, 'v', 1000);
    char key[32];
    CHECK(put("hot", value, STORE_SET, 0, 0) == STORE_STORED, "hot stored");
    for (int i = 0; i < 20000; i++) {
        if (i % 100 == 0)
            has("hot", value); /* read: eviction passes it over (CLOCK) */
        snprintf(key, sizeof(key), "cold-%d", i);
        put(key, value, STORE_SET, 0, 0);
    }
    CHECK(has("hot", value), "a key read often survives the eviction of its peers");
    teardown();
}

/* ---- items.c --------------------------------------------------------------- */

static void test_store_ops(void)
{
    setup(KEY_COMPARE_INLINE);
    struct copied c;
    CHECK(put("k", "one", STORE_SET, 0, 0) == STORE_STORED && has("k", "one"), "set");
    CHECK(put("k", "two", STORE_ADD, 0, 0) == STORE_NOT_STORED && has("k", "one"), "add over a key");
    CHECK(put("n", "x", STORE_REPLACE, 0, 0) == STORE_NOT_STORED && !has("n", "x"), "replace of nothing");
    CHECK(put("k", "two", STORE_REPLACE, 0, 0) == STORE_STORED && has("k", "two"), "replace");
    CHECK(put("k", "+", STORE_APPEND, 0, 0) == STORE_STORED && has("k", "two+"), "append");
    CHECK(put("k", "-", STORE_PREPEND, 0, 0) == STORE_STORED && has("k", "-two+"), "prepend");
    CHECK(put("n", "x", STORE_APPEND, 0, 0) == STORE_NOT_STORED, "append to nothing");
    CHECK(get_at("k", NOW, &c) == LOOKUP_HIT, "cas read");
    CHECK(put("k", "3", STORE_CAS, c.cas + 1, 0) == STORE_EXISTS && has("k", "-two+"), "cas mismatch");
    CHECK(put("k", "3", STORE_CAS, c.cas, 0) == STORE_STORED && has("k", "3"), "cas match");
    CHECK(put("n", "3", STORE_CAS, 1, 0) == STORE_NOT_FOUND, "cas of nothing");
    CHECK(get_at("k", NOW, &c) == LOOKUP_HIT && c.cas != 0, "every store takes a new cas");
    CHECK(items_delete("k", 1, hv_of("k"), NOW) == 1 && !has("k", "3"), "delete");
    CHECK(items_delete("k", 1, hv_of("k"), NOW) == 0, "delete of nothing");
    teardown();
}

static void test_arith(void)
{
    setup(KEY_COMPARE_INLINE);
    uint64_t v = 0;
    CHECK(items_arith("n", 1, hv_of("n"), 1, 1, NOW, &v) == ARITH_NOT_FOUND, "incr of nothing");
    put("n", "41", STORE_SET, 0, 0);
    CHECK(items_arith("n", 1, hv_of("n"), 1, 1, NOW, &v) == ARITH_OK && v == 42 && has("n", "42"), "incr");
    CHECK(items_arith("n", 1, hv_of("n"), 0, 50, NOW, &v) == ARITH_OK && v == 0 && has("n", "0"), "decr stops at 0");
    put("n", "18446744073709551615", STORE_SET, 0, 0);
    CHECK(items_arith("n", 1, hv_of("n"), 1, 2, NOW, &v) == ARITH_OK && v == 1, "incr wraps at 2^64");
    put("n", "12 ", STORE_SET, 0, 0);
    CHECK(items_arith("n", 1, hv_of("n"), 1, 1, NOW, &v) == ARITH_OK && v == 13, "trailing spaces are a number");
    put("n", "1x", STORE_SET, 0, 0);
    CHECK(items_arith("n", 1, hv_of("n"), 1, 1, NOW, &v) == ARITH_NON_NUMERIC, "not a number");
    teardown();
}

static void test_expiry_and_flush(void)
{
    setup(KEY_COMPARE_INLINE);
    struct copied c;
    put("e", "v", STORE_SET, 0, NOW + 10);
    CHECK(get_at("e", NOW + 9, &c) == LOOKUP_HIT, "before its expiry");
    CHECK(get_at("e", NOW + 10, &c) == LOOKUP_EXPIRED, "at its expiry");
    CHECK(get_at("e", NOW + 11, &c) == LOOKUP_MISS, "unlinked once found dead");
    put("t", "v", STORE_SET, 0, NOW + 10);
    CHECK(items_touch("t", 1, hv_of("t"), NOW + 100, NOW) == 1, "touch");
    CHECK(get_at("t", NOW + 50, &c) == LOOKUP_HIT, "touched: lives longer");
    CHECK(items_touch("x", 1, hv_of("x"), NOW + 100, NOW) == 0, "touch of nothing");
    uint64_t exp = NOW + 20;
    CHECK(items_get("t", 1, hv_of("t"), NOW, &exp, copy_out, &c) == LOOKUP_HIT, "gat");
    CHECK(get_at("t", NOW + 20, &c) == LOOKUP_EXPIRED, "gat set the expiry");
    put("f", "v", STORE_SET, 0, 0);
    items_flush(NOW + 1);
    CHECK(get_at("f", NOW, &c) == LOOKUP_HIT, "a delayed flush has not come yet");
    CHECK(get_at("f", NOW + 1, &c) == LOOKUP_FLUSHED, "flushed");
    items_flush_at = 0;
    teardown();
}

int main(void)
{
    test_hash(KEY_COMPARE_INLINE);
    test_hash(KEY_COMPARE_INDIRECT);
    test_life();
    test_eviction();
    test_page_move_counts_expired_unfetched();
    test_second_chance();
    test_store_ops();
    test_arith();
    test_expiry_and_flush();
    return checks_done("test_storage");
}
