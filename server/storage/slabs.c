#include "storage/slabs.h"

#include <stdlib.h>
#include <string.h>

#define PAGE_SIZE_MIN (1024u * 1024u)
#define CHUNK_MIN 96u
#define GROWTH 1.25

static slabclass_t classes[SLAB_CLASSES_MAX + 1]; /* index 0 unused */
static unsigned nclasses;
static size_t page_size;
static uint64_t pages_max;

static struct {
    kv_lock_t lock;      /* "slabs": the page table below; a leaf lock */
    kv_lock_t move_lock; /* "slabs": one page move at a time */
    uint64_t pages_used;
    uint64_t moved;
    void **pages;     /* every page, freed at teardown */
    uint8_t *owner;   /* class of each page */
} pool;

static uint32_t align8(size_t n) { return (uint32_t)((n + 7u) & ~(size_t)7u); }

int slabs_setup(size_t mem_limit, size_t item_size_max)
{
    size_t largest = align8(item_ntotal(KEY_MAX_LENGTH, (uint32_t)item_size_max));
    page_size = largest > PAGE_SIZE_MIN ? largest : PAGE_SIZE_MIN;
    pages_max = mem_limit / page_size;
    if (pages_max == 0)
        pages_max = 1;
    pool.pages = calloc(pages_max, sizeof(void *));
    pool.owner = calloc(pages_max, 1);
    if (pool.pages == NULL || pool.owner == NULL)
        return -1;
    lock_init(&pool.lock, LOCK_SLABS);
    lock_init(&pool.move_lock, LOCK_SLABS);

    double size = CHUNK_MIN;
    nclasses = 0;
    while (nclasses < SLAB_CLASSES_MAX - 1 && size < page_size / 2 && align8((size_t)size) < largest) {
        slabclass_t *c = &classes[++nclasses];
        c->size = align8((size_t)size);
        c->perslab = (uint32_t)(page_size / c->size);
        size = c->size * GROWTH;
    }
    slabclass_t *last = &classes[++nclasses];
    last->size = (uint32_t)largest;
    last->perslab = (uint32_t)(page_size / largest);
    for (unsigned i = 1; i <= nclasses; i++)
        lock_init(&classes[i].lock, LOCK_LRU);
    return 0;
}

void slabs_teardown(void)
{
    for (uint64_t i = 0; i < pool.pages_used; i++)
        free(pool.pages[i]);
    free(pool.pages);
    free(pool.owner);
    for (unsigned i = 1; i <= nclasses; i++)
        lock_destroy(&classes[i].lock);
    lock_destroy(&pool.lock);
    lock_destroy(&pool.move_lock);
    memset(classes, 0, sizeof(classes));
    memset(&pool, 0, sizeof(pool));
}

unsigned slabs_clsid(size_t total)
{
    /* Few classes, and only stores get here: a linear scan is fine. */
    for (unsigned i = 1; i <= nclasses; i++)
        if (total <= classes[i].size)
            return i;
    return 0;
}

slabclass_t *slabs_class(unsigned clsid) { return &classes[clsid]; }
unsigned slabs_nclasses(void) { return nclasses; }
size_t slabs_page_size(void) { return page_size; }
uint64_t slabs_mem_limit(void) { return pages_max * page_size; }

uint64_t slabs_total_malloced(void)
{
    return __atomic_load_n(&pool.pages_used, __ATOMIC_RELAXED) * page_size;
}

static void carve_locked(slabclass_t *c, void *page)
{
    for (uint32_t i = 0; i < c->perslab; i++) {
        item *it = (item *)((char *)page + (size_t)i * c->size);
        it->clsid = (uint8_t)(c - classes);
        it->iflags = ITEM_FREE;
        it->next = c->free_list;
        c->free_list = it;
    }
    c->pages++;
    c->total_chunks += c->perslab;
    c->free_chunks += c->perslab;
}

static int grow_locked(slabclass_t *c)
{
    void *page = NULL;
    kv_lock(&pool.lock);
    if (pool.pages_used < pages_max) {
        page = aligned_alloc(KV_CACHELINE, page_size);
        if (page != NULL) {
            pool.owner[pool.pages_used] = (uint8_t)(c - classes);
            pool.pages[pool.pages_used] = page;
            __atomic_store_n(&pool.pages_used, pool.pages_used + 1, __ATOMIC_RELAXED);
        }
    }
    kv_unlock(&pool.lock);
    if (page == NULL)
        return -1;
    carve_locked(c, page);
    return 0;
}

void slabs_move_lock(void) { kv_lock(&pool.move_lock); }
void slabs_move_unlock(void) { kv_unlock(&pool.move_lock); }
uint64_t slabs_moved(void) { return __atomic_load_n(&pool.moved, __ATOMIC_RELAXED); }

unsigned slabs_pick_victim(unsigned except)
{
    unsigned best = 0;
    uint64_t most = 0;
    uint64_t count[SLAB_CLASSES_MAX + 1] = {0};
    kv_lock(&pool.lock);
    for (uint64_t i = 0; i < pool.pages_used; i++)
        count[pool.owner[i]]++;
    kv_unlock(&pool.lock);
    for (unsigned i = 1; i <= nclasses; i++)
        if (i != except && count[i] > most) {
            most = count[i];
            best = i;
        }
    return best;
}

void *slabs_class_page(unsigned clsid, unsigned n)
{
    void *page = NULL;
    kv_lock(&pool.lock);
    for (uint64_t i = 0; i < pool.pages_used && page == NULL; i++)
        if (pool.owner[i] == clsid && n-- == 0)
            page = pool.pages[i];
    kv_unlock(&pool.lock);
    return page;
}

void slabs_release_page_locked(slabclass_t *victim, void *page)
{
    char *lo = page, *hi = lo + page_size;
    item **pp = &victim->free_list;
    while (*pp != NULL) {
        if ((char *)*pp >= lo && (char *)*pp < hi)
            *pp = (*pp)->next;
        else
            pp = &(*pp)->next;
    }
    victim->pages--;
    victim->total_chunks -= victim->perslab;
    victim->free_chunks -= victim->perslab;
}

void slabs_adopt_page(unsigned clsid, void *page)
{
    slabclass_t *c = &classes[clsid];
    kv_lock(&pool.lock);
    for (uint64_t i = 0; i < pool.pages_used; i++)
        if (pool.pages[i] == page)
            pool.owner[i] = (uint8_t)clsid;
    pool.moved++;
    kv_unlock(&pool.lock);
    kv_lock(&c->lock);
    carve_locked(c, page);
    kv_unlock(&c->lock);
}

item *slabs_take_chunk_locked(slabclass_t *c)
{
    if (c->free_list == NULL && grow_locked(c) != 0)
        return NULL;
    item *it = c->free_list;
    c->free_list = it->next;
    c->free_chunks--;
    it->iflags = 0;
    it->next = it->prev = it->hnext = NULL;
    return it;
}

void slabs_free_chunk_locked(slabclass_t *c, item *it)
{
    it->iflags = ITEM_FREE;
    it->prev = NULL;
    it->next = c->free_list;
    c->free_list = it;
    c->free_chunks++;
}

void lru_link_locked(slabclass_t *c, item *it)
{
    it->prev = NULL;
    it->next = c->head;
    if (c->head != NULL)
        c->head->prev = it;
    c->head = it;
    if (c->tail == NULL)
        c->tail = it;
    c->curr_items++;
    c->bytes += item_size(it);
}

void lru_unlink_locked(slabclass_t *c, item *it)
{
    if (it->prev != NULL)
        it->prev->next = it->next;
    else
        c->head = it->next;
    if (it->next != NULL)
        it->next->prev = it->prev;
    else
        c->tail = it->prev;
    it->prev = it->next = NULL;
    c->curr_items--;
    c->bytes -= item_size(it);
}
