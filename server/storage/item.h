/* The item: one allocation holding header, key, value and the value's
 * trailing "\r\n" (kept so a get copies the reply body in one memcpy). */
#ifndef KV_ITEM_H
#define KV_ITEM_H

#include <stdint.h>

#define KEY_MAX_LENGTH 250

enum item_flag {
    ITEM_LINKED = 1, /* in the hash table and an LRU */
    ITEM_ACTIVE = 2, /* read since it was last looked at by eviction (CLOCK bit) */
    ITEM_FETCHED = 4, /* read at least once (for expired_unfetched) */
    ITEM_FREE = 8,   /* a chunk on its class's free list */
};

typedef struct item {
    struct item *hnext;       /* hash chain */
    struct item *prev, *next; /* LRU of its slab class, head = most recent */
    uint64_t cas;
    uint64_t time_ns; /* monotonic time it was stored: flush_all compares it */
    uint64_t exp_ns;  /* monotonic expiry, 0 = never */
    uint32_t flags;   /* the client's opaque flags */
    uint32_t nbytes;  /* value length, without the trailing \r\n */
    uint32_t hv;      /* key hash, picks the bucket and the lock stripe */
    uint8_t nkey;
    uint8_t clsid;
    uint8_t iflags; /* enum item_flag, read and written with __atomic */
    uint8_t unused;
    char data[]; /* key, value, "\r\n" */
} item;

static inline uint32_t item_ntotal(uint32_t nkey, uint32_t nbytes)
{
    return (uint32_t)sizeof(item) + nkey + nbytes + 2;
}
static inline uint32_t item_size(const item *it) { return item_ntotal(it->nkey, it->nbytes); }
static inline char *item_key(item *it) { return it->data; }
static inline const char *item_ckey(const item *it) { return it->data; }
static inline char *item_value(item *it) { return it->data + it->nkey; }
static inline const char *item_cvalue(const item *it) { return it->data + it->nkey; }

/* The flags are read without the item's stripe lock (eviction tries it
 * only after looking), hence atomics. */
static inline int iflag_test(const item *it, uint8_t f) { return __atomic_load_n(&it->iflags, __ATOMIC_RELAXED) & f; }
static inline void iflag_set(item *it, uint8_t f) { __atomic_fetch_or(&it->iflags, f, __ATOMIC_RELAXED); }
static inline void iflag_clear(item *it, uint8_t f) { __atomic_fetch_and(&it->iflags, (uint8_t)~f, __ATOMIC_RELAXED); }

#endif
