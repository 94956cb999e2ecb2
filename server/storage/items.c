#include "storage/items.h"

#include <stdlib.h>
#include <string.h>

#include "core/lock.h"
#include "stats/sites.h"
#include "storage/slabs.h"
#include "trace.h"
#include "util.h"

#define STRIPES 1024u          /* item lock stripes, power of two */
#define EVICT_SEARCH_MAX 50    /* LRU tail items looked at per allocation */

static item **buckets;
static uint64_t hmask;
static kv_padded_lock_t stripes[STRIPES];
static uint64_t flush_at; /* ns; 0: no flush pending or done */
static __thread uint64_t cas_counter;

static inline kv_lock_t *stripe_of(uint64_t hv) { return &stripes[(hv & hmask) & (STRIPES - 1)].lock; }

static inline int iflag_test(const item *it, uint8_t f) { return __atomic_load_n(&it->iflags, __ATOMIC_RELAXED) & f; }
static inline void iflag_set(item *it, uint8_t f) { __atomic_fetch_or(&it->iflags, f, __ATOMIC_RELAXED); }
static inline void iflag_clear(item *it, uint8_t f) { __atomic_fetch_and(&it->iflags, (uint8_t)~f, __ATOMIC_RELAXED); }

uint64_t items_next_cas(void)
{
    /* Unique without a shared counter: the worker index in the low bits. */
    return (++cas_counter << 8) | ((uint64_t)kv_thread_idx & 0xff);
}

/* Why a linked item is no longer valid at `now`, or -1 if it is. */
static int dead_reason(const item *it, uint64_t now)
{
    if (it->exp_ns != 0 && it->exp_ns <= now)
        return DEL_EXPIRE;
    uint64_t fa = __atomic_load_n(&flush_at, __ATOMIC_RELAXED);
    if (fa != 0 && fa <= now && it->time_ns <= fa)
        return DEL_FLUSH;
    return -1;
}

/* The general design of --key-compare indirect: an ordering comparison
 * (as a sorted structure would need) called through a pointer for every item
 * of the chain, lengths compared only after the bytes. */
static int key_order(const char *a, size_t na, const char *b, size_t nb)
{
    int c = memcmp(a, b, na < nb ? na : nb);
    return c != 0 ? c : (na > nb) - (na < nb);
}

static enum key_compare key_mode = KEY_COMPARE_INLINE;
static int (*key_cmp)(const char *, size_t, const char *, size_t); /* set by items_setup */

const char *key_compare_name(enum key_compare mode)
{
    return mode == KEY_COMPARE_INDIRECT ? "indirect" : "inline";
}

enum key_compare items_key_compare(void) { return key_mode; }

static item *find_locked(const char *key, uint8_t nkey, uint64_t hv)
{
    if (key_mode == KEY_COMPARE_INDIRECT) {
        for (item *it = buckets[hv & hmask]; it != NULL; it = it->hnext)
            if (key_cmp(item_ckey(it), it->nkey, key, nkey) == 0)
                return it;
        return NULL;
    }
    for (item *it = buckets[hv & hmask]; it != NULL; it = it->hnext)
        if (it->nkey == nkey && memcmp(item_ckey(it), key, nkey) == 0)
            return it;
    return NULL;
}

static void hash_remove(item *it)
{
    item **pp = &buckets[it->hv & hmask];
    while (*pp != it)
        pp = &(*pp)->hnext;
    *pp = it->hnext;
    it->hnext = NULL;
}

static void on_linked(item *it)
{
    on_create_item();
    account_memory((int64_t)item_size(it));
    KVS_ITEM_CREATE(it, item_size(it));
}

static void on_unlinked(item *it, int reason)
{
    on_delete_item();
    account_memory(-(int64_t)item_size(it));
    KVS_ITEM_DELETE(it, item_size(it), reason);
}

/* With the stripe lock held: into the hash table and its class's LRU. */
static void link_locked(item *it)
{
    slabclass_t *c = slabs_class(it->clsid);
    it->hnext = buckets[it->hv & hmask];
    buckets[it->hv & hmask] = it;
    kv_lock(&c->lock);
    lru_link_locked(c, it);
    kv_unlock(&c->lock);
    iflag_set(it, ITEM_LINKED);
    on_linked(it);
}

/* With the stripe lock held: out of the hash table and the LRU, chunk freed. */
static void unlink_locked(item *it, int reason)
{
    slabclass_t *c = slabs_class(it->clsid);
    hash_remove(it);
    on_unlinked(it, reason);
    kv_lock(&c->lock);
    lru_unlink_locked(c, it);
    if (reason == DEL_EXPIRE && !iflag_test(it, ITEM_FETCHED))
        c->expired_unfetched++;
    slabs_free_chunk_locked(c, it);
    kv_unlock(&c->lock);
}

/* With the class lock held: reuse the chunk of an item from the LRU tail.
 * Expired and flushed items go first; an item read since eviction last saw
 * it gets a second chance at the head (CLOCK). The victim's stripe lock is
 * only tried: the usual order is stripe -> class, so blocking here could
 * deadlock. */
static item *evict_locked(slabclass_t *c)
{
    uint64_t now = now_ns();
    item *search = c->tail;
    for (int tries = 0; search != NULL && tries < EVICT_SEARCH_MAX; tries++) {
        item *prev = search->prev;
        int reason = dead_reason(search, now);
        if (reason < 0 && iflag_test(search, ITEM_ACTIVE)) {
            iflag_clear(search, ITEM_ACTIVE);
            lru_unlink_locked(c, search);
            lru_link_locked(c, search);
            search = prev;
            continue;
        }
        kv_lock_t *l = stripe_of(search->hv);
        if (!kv_trylock(l)) {
            search = prev;
            continue;
        }
        hash_remove(search);
        kv_unlock(l);
        lru_unlink_locked(c, search);
        if (reason < 0) {
            reason = DEL_EVICT;
            c->evicted++;
        } else {
            c->reclaimed++;
            if (reason == DEL_EXPIRE && !iflag_test(search, ITEM_FETCHED))
                c->expired_unfetched++;
        }
        on_unlinked(search, reason);
        return search;
    }
    return NULL;
}

/* Empties one page of another class and gives it to class `to`: without
 * this, once the limit is reached a value of a size never seen before could
 * never be stored (memcached's slab rebalancing, done inline and rarely).
 * Every item on the page must be linked or free; one that is in flight (a
 * value still arriving) or whose stripe lock is held makes it give up, and
 * what it already evicted stays as free chunks of the victim. */
static int move_page_to(unsigned to)
{
    int moved = 0;
    slabs_move_lock();
    unsigned v = slabs_pick_victim(to);
    slabclass_t *victim = v ? slabs_class(v) : NULL;
    for (unsigned n = 0; victim != NULL && n < 3 && !moved; n++) {
        kv_lock(&victim->lock);
        char *page = slabs_class_page(v, n);
        int ok = page != NULL;
        uint64_t now = now_ns();
        for (uint32_t i = 0; ok && i < victim->perslab; i++) {
            item *it = (item *)(page + (size_t)i * victim->size);
            if (iflag_test(it, ITEM_FREE))
                continue;
            kv_lock_t *l = stripe_of(it->hv);
            if (!iflag_test(it, ITEM_LINKED) || !kv_trylock(l)) {
                ok = 0;
                break;
            }
            int reason = dead_reason(it, now);
            hash_remove(it);
            kv_unlock(l);
            lru_unlink_locked(victim, it);
            if (reason < 0) {
                reason = DEL_EVICT;
                victim->evicted++;
            } else {
                victim->reclaimed++;
            }
            on_unlinked(it, reason);
            slabs_free_chunk_locked(victim, it);
        }
        if (ok)
            slabs_release_page_locked(victim, page);
        kv_unlock(&victim->lock);
        if (ok) {
            slabs_adopt_page(to, page);
            moved = 1;
        }
    }
    slabs_move_unlock();
    return moved;
}

item *items_alloc(const char *key, uint8_t nkey, uint32_t flags, uint64_t exp_ns, uint32_t nbytes)
{
    unsigned clsid = slabs_clsid(item_ntotal(nkey, nbytes));
    if (clsid == 0)
        return NULL;
    slabclass_t *c = slabs_class(clsid);
    kv_lock(&c->lock);
    item *it = slabs_take_chunk_locked(c);
    if (it == NULL)
        it = evict_locked(c);
    kv_unlock(&c->lock);
    if (it == NULL && move_page_to(clsid)) {
        kv_lock(&c->lock);
        it = slabs_take_chunk_locked(c);
        kv_unlock(&c->lock);
    }
    if (it == NULL) {
        kv_lock(&c->lock);
        c->outofmemory++;
        kv_unlock(&c->lock);
        return NULL;
    }
    it->hnext = it->prev = it->next = NULL;
    it->cas = 0;
    it->time_ns = 0;
    it->exp_ns = exp_ns;
    it->flags = flags;
    it->nbytes = nbytes;
    it->nkey = nkey;
    it->clsid = (uint8_t)clsid;
    it->iflags = 0;
    it->hv = 0;
    memcpy(item_key(it), key, nkey);
    return it;
}

void items_abandon(item *it)
{
    slabclass_t *c = slabs_class(it->clsid);
    kv_lock(&c->lock);
    slabs_free_chunk_locked(c, it);
    kv_unlock(&c->lock);
}

/* The live item for a key, with its stripe lock held; a dead one is
 * unlinked on the way and reported in *why. */
static item *lookup_locked(const char *key, uint8_t nkey, uint64_t hv, uint64_t now, int *why)
{
    item *it = find_locked(key, nkey, hv);
    *why = -1;
    if (it != NULL && (*why = dead_reason(it, now)) >= 0) {
        unlink_locked(it, *why);
        it = NULL;
    }
    return it;
}

enum lookup_result items_get(const char *key, uint8_t nkey, uint64_t hv, uint64_t now,
                             const uint64_t *touch_exp, item_copy_fn copy, void *ctx)
{
    kv_lock_t *l = stripe_of(hv);
    int why;
    kv_lock(l);
    item *it = lookup_locked(key, nkey, hv, now, &why);
    if (it == NULL) {
        kv_unlock(l);
        return why == DEL_EXPIRE ? LOOKUP_EXPIRED : why == DEL_FLUSH ? LOOKUP_FLUSHED : LOOKUP_MISS;
    }
    if (touch_exp != NULL)
        it->exp_ns = *touch_exp;
    /* Only write the flag byte when it changes: a hot key read by every
     * thread must not have its header line bounced by the flag itself. */
    if ((iflag_test(it, ITEM_ACTIVE | ITEM_FETCHED)) != (ITEM_ACTIVE | ITEM_FETCHED))
        iflag_set(it, ITEM_ACTIVE | ITEM_FETCHED);
    copy(ctx, it);
    kv_unlock(l);
    return LOOKUP_HIT;
}

static void replace_locked(item *old, item *it)
{
    unlink_locked(old, DEL_REPLACE);
    it->cas = items_next_cas();
    link_locked(it);
}

enum store_result items_store(item *it, enum store_op op, uint64_t cas_in, uint64_t hv, uint64_t now)
{
    kv_lock_t *l = stripe_of(hv);
    enum store_result r = STORE_STORED;
    int why;
    it->hv = (uint32_t)hv;
    it->time_ns = now;
    kv_lock(l);
    item *old = lookup_locked(item_key(it), it->nkey, hv, now, &why);
    switch (op) {
    case STORE_SET:
        if (old != NULL)
            unlink_locked(old, DEL_REPLACE);
        it->cas = items_next_cas();
        link_locked(it);
        it = NULL;
        break;
    case STORE_ADD:
        if (old != NULL) {
            iflag_set(old, ITEM_ACTIVE); /* memcached bumps it too */
            r = STORE_NOT_STORED;
        } else {
            it->cas = items_next_cas();
            link_locked(it);
            it = NULL;
        }
        break;
    case STORE_REPLACE:
    case STORE_CAS:
        if (old == NULL) {
            r = op == STORE_CAS ? STORE_NOT_FOUND : STORE_NOT_STORED;
        } else if (op == STORE_CAS && old->cas != cas_in) {
            r = STORE_EXISTS;
        } else {
            replace_locked(old, it);
            it = NULL;
        }
        break;
    case STORE_APPEND:
    case STORE_PREPEND:
        if (old == NULL) {
            r = STORE_NOT_STORED;
            break;
        }
        item *both = items_alloc(item_key(old), old->nkey, old->flags, old->exp_ns, old->nbytes + it->nbytes);
        if (both == NULL) {
            r = STORE_NO_MEMORY;
            break;
        }
        const item *first = op == STORE_APPEND ? old : it, *second = op == STORE_APPEND ? it : old;
        memcpy(item_value(both), item_cvalue(first), first->nbytes);
        memcpy(item_value(both) + first->nbytes, item_cvalue(second), second->nbytes + 2);
        both->hv = (uint32_t)hv;
        both->time_ns = now;
        replace_locked(old, both);
        break;
    }
    kv_unlock(l);
    if (it != NULL)
        items_abandon(it);
    return r;
}

int items_delete(const char *key, uint8_t nkey, uint64_t hv, uint64_t now)
{
    kv_lock_t *l = stripe_of(hv);
    int why;
    kv_lock(l);
    item *it = lookup_locked(key, nkey, hv, now, &why);
    if (it != NULL)
        unlink_locked(it, DEL_DELETE);
    kv_unlock(l);
    return it != NULL;
}

int items_touch(const char *key, uint8_t nkey, uint64_t hv, uint64_t exp_ns, uint64_t now)
{
    kv_lock_t *l = stripe_of(hv);
    int why;
    kv_lock(l);
    item *it = lookup_locked(key, nkey, hv, now, &why);
    if (it != NULL) {
        it->exp_ns = exp_ns;
        iflag_set(it, ITEM_ACTIVE);
    }
    kv_unlock(l);
    return it != NULL;
}

/* memcached's rule: decimal digits, optionally followed by spaces. */
static int parse_counter(const char *s, uint32_t n, uint64_t *out)
{
    uint64_t v = 0;
    uint32_t i = 0;
    if (n == 0 || s[0] < '0' || s[0] > '9')
        return 0;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    for (; i < n; i++)
        if (s[i] != ' ')
            return 0;
    *out = v;
    return 1;
}

enum arith_result items_arith(const char *key, uint8_t nkey, uint64_t hv, int incr, uint64_t delta,
                              uint64_t now, uint64_t *value)
{
    kv_lock_t *l = stripe_of(hv);
    enum arith_result r = ARITH_OK;
    int why;
    uint64_t v;
    kv_lock(l);
    item *old = lookup_locked(key, nkey, hv, now, &why);
    if (old == NULL) {
        r = ARITH_NOT_FOUND;
    } else if (!parse_counter(item_cvalue(old), old->nbytes, &v)) {
        r = ARITH_NON_NUMERIC;
    } else {
        /* incr wraps at 2^64 (unsigned arithmetic), decr stops at 0 */
        v = incr ? v + delta : (delta > v ? 0 : v - delta);
        char digits[24];
        int n = 0;
        uint64_t t = v;
        do {
            digits[n++] = (char)('0' + t % 10);
            t /= 10;
        } while (t != 0);
        item *it = items_alloc(key, nkey, old->flags, old->exp_ns, (uint32_t)n);
        if (it == NULL) {
            r = ARITH_NO_MEMORY;
        } else {
            for (int i = 0; i < n; i++)
                item_value(it)[i] = digits[n - 1 - i];
            memcpy(item_value(it) + n, "\r\n", 2);
            it->hv = (uint32_t)hv;
            it->time_ns = now;
            replace_locked(old, it);
            *value = v;
        }
    }
    kv_unlock(l);
    return r;
}

void items_flush(uint64_t at_ns) { __atomic_store_n(&flush_at, at_ns ? at_ns : 1, __ATOMIC_RELAXED); }

void items_totals(struct items_totals *out)
{
    memset(out, 0, sizeof(*out));
    for (unsigned i = 1; i <= slabs_nclasses(); i++) {
        slabclass_t *c = slabs_class(i);
        kv_lock(&c->lock);
        out->curr_items += c->curr_items;
        out->bytes += c->bytes;
        out->evictions += c->evicted;
        out->reclaimed += c->reclaimed;
        out->expired_unfetched += c->expired_unfetched;
        kv_unlock(&c->lock);
    }
}

int items_setup(size_t mem_limit, size_t item_size_max, enum key_compare mode)
{
    key_mode = mode;
    key_cmp = mode == KEY_COMPARE_INDIRECT ? key_order : NULL;
    if (slabs_setup(mem_limit, item_size_max) != 0)
        return -1;
    unsigned power = 16;
    while (power < 24 && (1ull << power) < mem_limit / 128)
        power++;
    buckets = calloc(1ull << power, sizeof(item *));
    if (buckets == NULL)
        return -1;
    hmask = (1ull << power) - 1;
    for (unsigned i = 0; i < STRIPES; i++)
        lock_init(&stripes[i].lock, LOCK_ITEM);
    return 0;
}

void items_teardown(void)
{
    for (unsigned i = 0; i < STRIPES; i++)
        lock_destroy(&stripes[i].lock);
    free(buckets);
    buckets = NULL;
    slabs_teardown();
}
