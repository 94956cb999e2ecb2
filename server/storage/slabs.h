/* Slab allocator: memory comes in pages (1 MiB, or the largest item if
 * bigger), at most -m worth of them; each page is carved into equal chunks
 * of one size class (classes grow by 1.25). Each class has a free list and
 * an LRU of its linked items, both under the class's `lru` lock; the page
 * pool is under the `slabs` lock. */
#ifndef KV_SLABS_H
#define KV_SLABS_H

#include <stddef.h>
#include <stdint.h>

#include "core/lock.h"
#include "storage/item.h"

#define SLAB_CLASSES_MAX 64

typedef struct slabclass {
    kv_lock_t lock; /* "lru": free list, LRU, counters below */
    uint32_t size;  /* chunk size */
    uint32_t perslab;
    item *free_list; /* chained through ->next */
    item *head, *tail;
    uint64_t pages;
    uint64_t total_chunks;
    uint64_t free_chunks;
    uint64_t curr_items; /* linked items, in the LRU */
    uint64_t bytes;      /* item_size() of linked items */
    uint64_t evicted;
    uint64_t reclaimed; /* expired or flushed items whose chunk was reused */
    uint64_t expired_unfetched;
    uint64_t outofmemory;
} KV_ALIGNED slabclass_t;

int slabs_setup(size_t mem_limit, size_t item_size_max);
void slabs_teardown(void);
/* Class for an item of `total` bytes, 0 if it is larger than any class. */
unsigned slabs_clsid(size_t total);
slabclass_t *slabs_class(unsigned clsid);
unsigned slabs_nclasses(void);
size_t slabs_page_size(void);
uint64_t slabs_mem_limit(void);
uint64_t slabs_total_malloced(void);
/* With the class lock held: a free chunk (from the free list or a new page),
 * or NULL when the class has none and the memory limit is reached. */
item *slabs_take_chunk_locked(slabclass_t *c);
void slabs_free_chunk_locked(slabclass_t *c, item *it);
void lru_link_locked(slabclass_t *c, item *it);
/* Moving a page between classes (when a class has nothing to evict and the
 * limit is reached): serialized by slabs_move_lock(); see items.c. */
void slabs_move_lock(void);
void slabs_move_unlock(void);
/* The class other than `except` with the most pages, 0 if none. */
unsigned slabs_pick_victim(unsigned except);
/* The n-th page of a class, NULL past its last. */
void *slabs_class_page(unsigned clsid, unsigned n);
/* With the victim's lock held: drop every chunk of `page` from its free list
 * (all of them must be free by then) and forget the page. */
void slabs_release_page_locked(slabclass_t *victim, void *page);
/* Carves a released page into chunks of class `clsid`. */
void slabs_adopt_page(unsigned clsid, void *page);
uint64_t slabs_moved(void);
void lru_unlink_locked(slabclass_t *c, item *it);

#endif
