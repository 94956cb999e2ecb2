#include "storage/items.h"

#include <stdlib.h>
#include <string.h>

#include "core/lock.h"
#include "storage/hash.h"
#include "storage/life.h"
#include "storage/slabs.h"
#include "util.h"

static __thread uint64_t cas_counter;

uint64_t items_next_cas(void)
{
    /* Unique without a shared counter: the worker index in the low bits. */
    return (++cas_counter << 8) | ((uint64_t)kv_thread_idx & 0xff);
}

enum key_compare items_key_compare(void) { return hash.mode; }

/* With the stripe lock held: into the hash table and its class's LRU. */
static void link_locked(item *it)
{
    slabclass_t *c = slabs_class(it->clsid);
    hash_insert(it);
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

/* The live item for a key, with its stripe lock held; a dead one is
 * unlinked on the way and reported in *why. */
static item *lookup_locked(const char *key, uint8_t nkey, uint64_t hv, uint64_t now, int *why)
{
    item *it = hash_find(key, nkey, hv);
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

void items_flush(uint64_t at_ns) { __atomic_store_n(&items_flush_at, at_ns ? at_ns : 1, __ATOMIC_RELAXED); }

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
    if (slabs_setup(mem_limit, item_size_max) != 0)
        return -1;
    return hash_setup(mem_limit, mode);
}

void items_teardown(void)
{
    hash_teardown();
    slabs_teardown();
}
