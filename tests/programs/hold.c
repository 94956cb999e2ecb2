/* A global mutex held a known time (tests/test_hold.py, `record --hold`).
 *
 *   hold HOLD_NS
 *
 * THREADS threads wait; each line `go N` on stdin makes each of them take
 * `timed_lock` N times, busy-waiting HOLD_NS ns (by the monotonic clock)
 * inside it, and take `other_lock` as often around an empty critical section
 * (a mutex the probes must leave out); then it prints `done TOTAL`, the
 * acquisitions of `timed_lock` that round. Prints "ready" once every thread
 * runs; exits when its stdin is closed.
 *
 * Built by the test with: cc -O1 -g -pthread
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define THREADS 2

pthread_mutex_t timed_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t other_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t start, end;
static long rounds;  /* N of the current round, 0: exit */
static long hold_ns;
static volatile unsigned long shared_total;

static long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void *worker(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_barrier_wait(&start);
        if (rounds == 0)
            return NULL;
        for (long i = 0; i < rounds; i++) {
            pthread_mutex_lock(&timed_lock);
            long until = now_ns() + hold_ns;
            while (now_ns() < until)
                shared_total++;
            pthread_mutex_unlock(&timed_lock);
            pthread_mutex_lock(&other_lock);
            shared_total++;
            pthread_mutex_unlock(&other_lock);
            usleep(100);
        }
        pthread_barrier_wait(&end);
    }
}

int main(int argc, char **argv)
{
    hold_ns = argc > 1 ? atol(argv[1]) : 20000;
    pthread_t threads[THREADS];
    pthread_barrier_init(&start, NULL, THREADS + 1);
    pthread_barrier_init(&end, NULL, THREADS + 1);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, worker, NULL);
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof(line), stdin)) {
        long n = 0;
        if (sscanf(line, "go %ld", &n) != 1 || n <= 0)
            continue;
        rounds = n;
        pthread_barrier_wait(&start);
        pthread_barrier_wait(&end);
        printf("done %ld\n", n * THREADS);
        fflush(stdout);
    }
    rounds = 0;
    pthread_barrier_wait(&start);
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    return 0;
}
