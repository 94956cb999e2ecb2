/* The memcached text protocol as kvload speaks it: a batch of requests
 * written into a connection's output, the replies to it read back. */
#ifndef KVLOAD_BATCH_H
#define KVLOAD_BATCH_H

#include <stdbool.h>

#include "loadgen/thread.h"

/* The next batch of the run: --batch-size requests, the sets first as
 * pipelined `set`s, then all the gets as one multi-key `get`. */
void build_batch(struct thread *t, struct conn *c);
/* A batch of sets of the keys *next.. (up to the thread's populate_to). */
void build_populate(struct thread *t, struct conn *c, long *next);
/* Parses what has arrived (counting it, and timing it when `measure`).
 * Returns 1 when the batch is complete, 0 when more is needed, -1 on a
 * protocol error (the connection is then dropped). */
int parse_replies(struct thread *t, struct conn *c, bool measure);

#endif
