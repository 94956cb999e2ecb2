/* A kvload thread and its connections: what the batches are built into,
 * what the replies are counted in. Each is touched by its thread only,
 * until main merges the counts at the end. */
#ifndef KVLOAD_THREAD_H
#define KVLOAD_THREAD_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loadgen/hist.h"

struct counters {
    uint64_t ops, gets, sets, hits, misses, errors, mismatches;
};

struct conn {
    int fd;
    char *out;
    size_t out_len, out_sent, out_cap;
    char *in;
    size_t in_len, in_cap;
    /* the batch in flight */
    int nsets, ngets;
    int sets_left;    /* STORED lines still expected */
    bool get_pending; /* VALUE..END still expected */
    long *get_keys;   /* key numbers of the batch's gets, in order */
    int get_seen;
    uint64_t sent_at;
    long cycles;
    bool done;
};

struct thread {
    pthread_t tid;
    int idx;
    uint64_t rng;
    struct conn *conns;
    struct counters n;
    struct hist hist;
    long populate_from, populate_to;
    int connect_failed;
    char *value_buf;
};

#endif
