/* A pthread mutex contended so hard that the lock is taken inside glibc
 * (tests/test_debuginfo.py): THREADS threads loop on lock, a short critical
 * section, unlock. The waits happen in glibc's own functions
 * (`__lll_lock_wait`, the unlock's `__pthread_mutex_unlock_usercnt`), which
 * only its debug file names. Prints "ready" once every thread runs; exits
 * when its stdin is closed or after SECONDS (default 60).
 *
 * Built by the test with: cc -O1 -g -pthread
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define THREADS 4

static atomic_int stop;
static atomic_int running;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile unsigned long shared_total;

static void *worker(void *arg)
{
    (void)arg;
    atomic_fetch_add(&running, 1);
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        pthread_mutex_lock(&lock);
        for (int i = 0; i < 50; i++)
            shared_total += (unsigned long)i;
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int seconds = argc > 1 ? atoi(argv[1]) : 60;
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, worker, NULL);
    while (atomic_load(&running) < THREADS)
        usleep(1000);
    printf("ready\n");
    fflush(stdout);
    struct pollfd in = {.fd = 0, .events = POLLIN};
    char buf[64];
    if (poll(&in, 1, seconds * 1000) > 0)
        (void)read(0, buf, sizeof(buf)); /* stdin closed (or anything read): stop */
    atomic_store(&stop, 1);
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    return 0;
}
