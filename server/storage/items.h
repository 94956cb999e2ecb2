/* The cache: a hash table of items with striped locks (`item_lock`), on top
 * of the slab allocator. Every access to an item's bytes happens under its
 * stripe lock, and items are only freed under it, so no reference counts are
 * needed: a get copies the value out while it holds the lock. */
#ifndef KV_ITEMS_H
#define KV_ITEMS_H

#include <stddef.h>
#include <stdint.h>

#include "storage/item.h"

enum store_op { STORE_SET, STORE_ADD, STORE_REPLACE, STORE_APPEND, STORE_PREPEND, STORE_CAS };
enum store_result { STORE_STORED, STORE_NOT_STORED, STORE_EXISTS, STORE_NOT_FOUND, STORE_NO_MEMORY };
enum lookup_result { LOOKUP_HIT, LOOKUP_MISS, LOOKUP_EXPIRED, LOOKUP_FLUSHED };
enum arith_result { ARITH_OK, ARITH_NOT_FOUND, ARITH_NON_NUMERIC, ARITH_NO_MEMORY };
/* item__delete reasons, as documented in probes/kvs.d */
enum delete_reason { DEL_DELETE, DEL_EXPIRE, DEL_EVICT, DEL_REPLACE, DEL_FLUSH };

/* How the hash lookup compares keys (--key-compare): INLINE checks the
 * length, then memcmp, in the loop; INDIRECT calls a general ordering
 * comparison through a function pointer for every item of the chain. */
enum key_compare { KEY_COMPARE_INLINE, KEY_COMPARE_INDIRECT };
const char *key_compare_name(enum key_compare mode);
enum key_compare items_key_compare(void);

int items_setup(size_t mem_limit, size_t item_size_max, enum key_compare mode);
void items_teardown(void);

/* Called with the item's stripe lock held, to copy what the reply needs. */
typedef void (*item_copy_fn)(void *ctx, const item *it);

/* Looks the key up; on a hit calls copy(ctx, it) under the lock. With
 * touch_exp != NULL, also sets the item's expiry (gat). */
enum lookup_result items_get(const char *key, uint8_t nkey, uint64_t hv, uint64_t now,
                             const uint64_t *touch_exp, item_copy_fn copy, void *ctx);

/* A chunk for a new item with its key copied in; the caller fills the value
 * (item_value(), nbytes + "\r\n") then calls items_store or items_abandon.
 * NULL: out of memory (nothing could be evicted). */
item *items_alloc(const char *key, uint8_t nkey, uint32_t flags, uint64_t exp_ns, uint32_t nbytes);
void items_abandon(item *it);
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
