/* A kvload thread's run: its connections to the server, driven from one
 * epoll loop, each sending a batch, reading every reply, and sending the
 * next, until the run ends. */
#ifndef KVLOAD_DRIVE_H
#define KVLOAD_DRIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "loadgen/thread.h"

extern volatile int stop_flag;   /* set by a signal, or when a thread could not connect */
extern uint64_t run_deadline;    /* ns, 0: none */
extern uint64_t progress_ops[256]; /* each thread's ops so far, for the progress line */

/* A connected socket to --server, or -1. */
int connect_server(void);
/* Drives the thread's connections until every one is done. populate: one
 * pass of sets over the thread's share of the keys instead of the run. */
void drive(struct thread *t, bool populate);

#endif
