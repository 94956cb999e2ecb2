/* Room for a new item: a free chunk of its size class, else the chunk of an
 * item from that class's LRU tail (expired and flushed ones first, a
 * recently read one given a second chance: CLOCK), else a page moved from
 * another class. */
#ifndef KV_EVICT_H
#define KV_EVICT_H

#include <stdint.h>

#include "storage/item.h"

/* A chunk for a new item with its key copied in; the caller fills the value
 * (item_value(), nbytes + "\r\n") then calls items_store or items_abandon.
 * NULL: out of memory (nothing could be evicted). */
item *items_alloc(const char *key, uint8_t nkey, uint32_t flags, uint64_t exp_ns, uint32_t nbytes);
void items_abandon(item *it);

#endif
