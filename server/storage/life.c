#include "storage/life.h"

#include "stats/sites.h"
#include "trace.h"

uint64_t items_flush_at;

void on_linked(item *it)
{
    on_create_item();
    account_memory((int64_t)item_size(it));
    KVS_ITEM_CREATE(it, item_size(it));
}

void on_unlinked(item *it, int reason)
{
    on_delete_item();
    account_memory(-(int64_t)item_size(it));
    KVS_ITEM_DELETE(it, item_size(it), reason);
}
