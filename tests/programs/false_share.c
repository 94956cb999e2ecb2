/* A known false-sharing workload for the regsample collector (tests/test_regsample.py).
 *
 *   false_share [SECONDS]
 *
 * Three threads ("adder-0".."adder-2") atomic_fetch_add on two counters of one
 * named global struct that share a 64-byte line: adder-0 on shared_line.hits,
 * adder-1 and adder-2 on shared_line.misses. No kvs probes, no locks. Prints
 * "ready" once every thread runs; exits when its stdin closes or after
 * SECONDS (default 60).
 *
 * Built by the test with: cc -O2 -g -pthread
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct counters {
    _Atomic unsigned long hits;
    _Atomic unsigned long misses;
} __attribute__((aligned(64)));

struct counters shared_line;
static atomic_int stop;
static atomic_int running;

static void *adder(void *arg)
{
    _Atomic unsigned long *c = arg;
    atomic_fetch_add(&running, 1);
    while (!atomic_load_explicit(&stop, memory_order_relaxed))
        atomic_fetch_add(c, 1);
    return NULL;
}

int main(int argc, char **argv)
{
    int secs = argc > 1 ? atoi(argv[1]) : 60;
    _Atomic unsigned long *targets[3] = {&shared_line.hits, &shared_line.misses, &shared_line.misses};
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        char name[16];
        pthread_create(&t[i], NULL, adder, targets[i]);
        snprintf(name, sizeof(name), "adder-%d", i);
        pthread_setname_np(t[i], name);
    }
    while (atomic_load(&running) < 3)
        ;
    printf("ready\n");
    fflush(stdout);
    struct pollfd in = {.fd = 0, .events = POLLIN};
    time_t end = time(NULL) + secs;
    while (time(NULL) < end && poll(&in, 1, 100) == 0)
        ;
    atomic_store(&stop, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    printf("%lu %lu\n", shared_line.hits, shared_line.misses);
    return 0;
}
