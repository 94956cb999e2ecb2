/* The cache: what the commands do to items (get, store, delete, touch,
 * incr/decr, flush_all) in a hash table with striped locks (`item_lock`,
 * storage/hash.h), on top of the slab allocator (slabs.h) and its
 * eviction (evict.h). Every access to an item's bytes happens under its
 * stripe lock, and items are only freed under it, so no reference counts are
 * needed: a get copies the value out while it holds the lock. */
#ifndef KV_ITEMS_H
#define KV_ITEMS_H

#include <stddef.h>
#include <stdint.h>

#include "storage/evict.h"
#include "storage/hash.h"
#include "storage/item.h"

enum store_op { STORE_SET, STORE_ADD, STORE_REPLACE, STORE_APPEND, STORE_PREPEND, STORE_CAS };
enum store_result { STORE_STORED, STORE_NOT_STORED, STORE_EXISTS, STORE_NOT_FOUND, STORE_NO_MEMORY };
enum lookup_result { LOOKUP_HIT, LOOKUP_MISS, LOOKUP_EXPIRED, LOOKUP_FLUSHED };
enum arith_result { ARITH_OK, ARITH_NOT_FOUND, ARITH_NON_NUMERIC, ARITH_NO_MEMORY };
/* --key-compare (enum key_compare: storage/hash.h) */
enum key_compare items_key_compare(void);

int items_setup(size_t mem_limit, size_t item_size_max, enum key_compare mode);
void items_teardown(void);

/* Called with the item's stripe lock held, to copy what the reply needs. */
typedef void (*item_copy_fn)(void *ctx, const item *it);

/* Looks the key up; on a hit calls copy(ctx, it) under the lock. With
 * touch_exp != NULL, also sets the item's expiry (gat). */
enum lookup_result items_get(const char *key, uint8_t nkey, uint64_t hv, uint64_t now,
                             const uint64_t *touch_exp, item_copy_fn copy, void *ctx);

/* items_alloc() and items_abandon(): storage/evict.h. */
/* Links `it` according to `op`, or frees it. `hv` is kv_hash() of the key. */
enum store_result items_store(item *it, enum store_op op, uint64_t cas_in, uint64_t hv, uint64_t now);

int items_delete(const char *key, uint8_t nkey, uint64_t hv, uint64_t now);
int items_touch(const char *key, uint8_t nkey, uint64_t hv, uint64_t exp_ns, uint64_t now);
enum arith_result items_arith(const char *key, uint8_t nkey, uint64_t hv, int incr, uint64_t delta,
                              uint64_t now, uint64_t *value);
/* Invalidates every item stored at or before `at_ns` once `at_ns` has come. */
void items_flush(uint64_t at_ns);

uint64_t items_next_cas(void);

struct items_totals {
    uint64_t curr_items, bytes, evictions, reclaimed, expired_unfetched;
};
void items_totals(struct items_totals *out);

#endif
