/* Worker threads: each runs its own event loop over the connections the
 * main thread hands it (round-robin), named kv-worker-N. */
#ifndef KV_WORKER_H
#define KV_WORKER_H

#include <pthread.h>

#include "core/conn.h"
#include "core/ev.h"
#include "core/lock.h"

typedef struct worker {
    int idx;
    pthread_t thread;
    ev_loop_t *loop;
    int wakefd;    /* eventfd: new connections or stop */
    kv_lock_t qlock; /* "connq" */
    int *queue;    /* fds handed over, not yet taken */
    size_t qlen, qcap;
    conn *conns;
} worker_t;

int workers_setup(int n);
int workers_start(void);
/* Hands an accepted socket to the next worker; -1 if it could not. */
int workers_dispatch(int fd);
void workers_stop(void);
void workers_teardown(void);

#endif
