/* A known workload for the generic collectors (tests/test_collect_cpu.py).
 *
 *   contend [SECONDS]
 *
 * Thread "hot" calls spin_hot_function() in a loop and never touches a lock,
 * so it owns the on-CPU profile and makes no futex call. Threads "mutex-a"
 * and "mutex-b" fight over one pthread mutex: each holds it while spinning
 * briefly and then sleeping, so the other one always finds it taken and
 * sleeps in FUTEX_WAIT. Prints "ready" once every thread is named; exits
 * when its stdin is closed or after SECONDS (default 60), whichever is first.
 *
 * Built by the test with: cc -O1 -g -fno-omit-frame-pointer -pthread
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static atomic_int stop;
static atomic_int named;
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;

unsigned long spin_hot_function(unsigned long n);
unsigned long spin_in_lock(unsigned long n);

__attribute__((noinline)) unsigned long spin_hot_function(unsigned long n)
{
    volatile unsigned long x = 0;
    for (unsigned long i = 0; i < n; i++)
        x += i * 7;
    return x;
}

__attribute__((noinline)) unsigned long spin_in_lock(unsigned long n)
{
    volatile unsigned long x = 0;
    for (unsigned long i = 0; i < n; i++)
        x ^= i;
    return x;
}

static void *hot_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "hot");
    atomic_fetch_add(&named, 1);
    while (!atomic_load_explicit(&stop, memory_order_relaxed))
        spin_hot_function(100000);
    return NULL;
}

static void *mutex_main(void *arg)
{
    pthread_setname_np(pthread_self(), (const char *)arg);
    atomic_fetch_add(&named, 1);
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        pthread_mutex_lock(&shared_lock);
        spin_in_lock(20000);
        usleep(300); /* holding it: the other thread has to wait */
        pthread_mutex_unlock(&shared_lock);
        usleep(50); /* let the waiter in (glibc mutexes are not fair) */
    }
    return NULL;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 60.0;
    pthread_t threads[3];
    pthread_create(&threads[0], NULL, hot_main, NULL);
    pthread_create(&threads[1], NULL, mutex_main, "mutex-a");
    pthread_create(&threads[2], NULL, mutex_main, "mutex-b");
    while (atomic_load(&named) < 3)
        usleep(1000);
    printf("ready\n");
    fflush(stdout);
    struct pollfd in = {.fd = 0, .events = POLLIN};
    struct timespec now, end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += (time_t)seconds;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left_ms = (end.tv_sec - now.tv_sec) * 1000 + (end.tv_nsec - now.tv_nsec) / 1000000;
        if (left_ms <= 0)
            break;
        char buf[64];
        if (poll(&in, 1, (int)left_ms) > 0 && read(0, buf, sizeof(buf)) <= 0)
            break; /* stdin closed */
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(threads[i], NULL);
    return 0;
}
