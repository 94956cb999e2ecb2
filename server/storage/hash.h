/* The hash table of linked items and its striped locks (`item_lock`): an
 * item is found, linked and unlinked only under the stripe of its hash.
 * The lookup is inline so that it stays in its caller's frame (the
 * profiles' `lookup_locked`). */
#ifndef KV_HASH_H
#define KV_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/lock.h"
#include "storage/item.h"

#define STRIPES 1024u /* item lock stripes, power of two */

/* How the hash lookup compares keys (--key-compare): INLINE checks the
 * length, then memcmp, in the loop; INDIRECT calls a general ordering
 * comparison through a function pointer for every item of the chain. */
enum key_compare { KEY_COMPARE_INLINE, KEY_COMPARE_INDIRECT };
const char *key_compare_name(enum key_compare mode);

struct hash_table {
    item **buckets;
    uint64_t mask; /* buckets - 1 */
    enum key_compare mode;
    int (*cmp)(const char *, size_t, const char *, size_t); /* KEY_COMPARE_INDIRECT's */
};
extern struct hash_table hash;
extern kv_padded_lock_t hash_stripes[STRIPES];

/* Buckets for about one item in 128 bytes of `mem_limit`, 2^16 to 2^24. */
int hash_setup(size_t mem_limit, enum key_compare mode);
void hash_teardown(void);

static inline kv_lock_t *stripe_of(uint64_t hv) { return &hash_stripes[(hv & hash.mask) & (STRIPES - 1)].lock; }

/* With the key's stripe lock held: its item, linked or not yet found dead. */
static inline item *hash_find(const char *key, uint8_t nkey, uint64_t hv)
{
    if (hash.mode == KEY_COMPARE_INDIRECT) {
        for (item *it = hash.buckets[hv & hash.mask]; it != NULL; it = it->hnext)
            if (hash.cmp(item_ckey(it), it->nkey, key, nkey) == 0)
                return it;
        return NULL;
    }
    for (item *it = hash.buckets[hv & hash.mask]; it != NULL; it = it->hnext)
        if (it->nkey == nkey && memcmp(item_ckey(it), key, nkey) == 0)
            return it;
    return NULL;
}

/* With the item's stripe lock held: into its bucket (it->hv set), out of it. */
static inline void hash_insert(item *it)
{
    it->hnext = hash.buckets[it->hv & hash.mask];
    hash.buckets[it->hv & hash.mask] = it;
}

void hash_remove(item *it);

#endif
