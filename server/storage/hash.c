#include "storage/hash.h"

#include <stdlib.h>

struct hash_table hash = {.mode = KEY_COMPARE_INLINE};
kv_padded_lock_t hash_stripes[STRIPES];

/* The general design of --key-compare indirect: an ordering comparison
 * (as a sorted structure would need) called through a pointer for every item
 * of the chain, lengths compared only after the bytes. */
static int key_order(const char *a, size_t na, const char *b, size_t nb)
{
    int c = memcmp(a, b, na < nb ? na : nb);
    return c != 0 ? c : (na > nb) - (na < nb);
}

const char *key_compare_name(enum key_compare mode)
{
    return mode == KEY_COMPARE_INDIRECT ? "indirect" : "inline";
}

void hash_remove(item *it)
{
    item **pp = &hash.buckets[it->hv & hash.mask];
    while (*pp != it)
        pp = &(*pp)->hnext;
    *pp = it->hnext;
    it->hnext = NULL;
}

int hash_setup(size_t mem_limit, enum key_compare mode)
{
    hash.mode = mode;
    hash.cmp = mode == KEY_COMPARE_INDIRECT ? key_order : NULL;
    unsigned power = 16;
    while (power < 24 && (1ull << power) < mem_limit / 128)
        power++;
    hash.buckets = calloc(1ull << power, sizeof(item *));
    if (hash.buckets == NULL)
        return -1;
    hash.mask = (1ull << power) - 1;
    for (unsigned i = 0; i < STRIPES; i++)
        lock_init(&hash_stripes[i].lock, LOCK_ITEM);
    return 0;
}

void hash_teardown(void)
{
    for (unsigned i = 0; i < STRIPES; i++)
        lock_destroy(&hash_stripes[i].lock);
    free(hash.buckets);
    hash.buckets = NULL;
}
