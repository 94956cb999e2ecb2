#include "storage/evict.h"

#include <string.h>

#include "core/lock.h"
#include "storage/hash.h"
#include "storage/life.h"
#include "storage/slabs.h"
#include "util.h"

#define EVICT_SEARCH_MAX 50 /* LRU tail items looked at per allocation */

/* With the class lock and the item's stripe lock `l` held: `it` out of the
 * hash table (then `l` is let go) and out of the LRU, counted as evicted
 * (reason < 0: it was alive) or reclaimed (it was dead already). */
static void take_out_locked(slabclass_t *c, item *it, kv_lock_t *l, int reason)
{
    hash_remove(it);
    kv_unlock(l);
    lru_unlink_locked(c, it);
    if (reason < 0) {
        reason = DEL_EVICT;
        c->evicted++;
    } else {
        c->reclaimed++;
        if (reason == DEL_EXPIRE && !iflag_test(it, ITEM_FETCHED))
            c->expired_unfetched++;
    }
    on_unlinked(it, reason);
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
        take_out_locked(c, search, l, reason);
        return search;
    }
    return NULL;
}

/* With the victim's lock held: every item of `page` unlinked, its chunk
 * free. 0 when one is in flight (a value still arriving) or its stripe lock
 * is held: then the page stays, and what was evicted stays as free chunks. */
static int empty_page_locked(slabclass_t *victim, char *page)
{
    uint64_t now = now_ns();
    for (uint32_t i = 0; i < victim->perslab; i++) {
        item *it = (item *)(page + (size_t)i * victim->size);
        if (iflag_test(it, ITEM_FREE))
            continue;
        kv_lock_t *l = stripe_of(it->hv);
        if (!iflag_test(it, ITEM_LINKED) || !kv_trylock(l))
            return 0;
        take_out_locked(victim, it, l, dead_reason(it, now));
        slabs_free_chunk_locked(victim, it);
    }
    return 1;
}

/* Empties one page of another class and gives it to class `to`: without
 * this, once the limit is reached a value of a size never seen before could
 * never be stored (memcached's slab rebalancing, done inline and rarely). */
static int move_page_to(unsigned to)
{
    int moved = 0;
    slabs_move_lock();
    unsigned v = slabs_pick_victim(to);
    slabclass_t *victim = v ? slabs_class(v) : NULL;
    for (unsigned n = 0; victim != NULL && n < 3 && !moved; n++) {
        kv_lock(&victim->lock);
        char *page = slabs_class_page(v, n);
        int ok = page != NULL && empty_page_locked(victim, page);
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

/* A chunk of class `clsid`, by any of the three ways; NULL when none worked. */
static item *take_chunk(unsigned clsid)
{
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
    }
    return it;
}

item *items_alloc(const char *key, uint8_t nkey, uint32_t flags, uint64_t exp_ns, uint32_t nbytes)
{
    unsigned clsid = slabs_clsid(item_ntotal(nkey, nbytes));
    if (clsid == 0)
        return NULL;
    item *it = take_chunk(clsid);
    if (it == NULL)
        return NULL;
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
