/* Two threads contending on a named static mutex inside a named function,
 * for tests/test_unwind.py (lock naming). Built there with -O2.
 *
 *   ledger
 *
 * Prints "ready", waits for a line on stdin, then both threads call
 * post_entry() (which takes `ledger_lock`, works and sleeps holding it) until
 * the next line; then prints the nanoseconds both threads spent in
 * pthread_mutex_lock, by its own clock, and exits when stdin closes.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile unsigned long ledger;
static atomic_int running = 1;
static long long waited_ns[2];

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

__attribute__((noinline)) void post_entry(int me)
{
    long long t0 = now_ns();
    pthread_mutex_lock(&ledger_lock);
    waited_ns[me] += now_ns() - t0;
    for (int i = 0; i < 20000; i++)
        ledger += i;
    usleep(200);
    pthread_mutex_unlock(&ledger_lock);
}

static void *worker(void *arg)
{
    int me = (int)(long)arg;
    while (atomic_load(&running)) {
        post_entry(me);
        usleep(30);
    }
    return NULL;
}

int main(void)
{
    char line[64];
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 1;
    pthread_t t[2];
    for (long i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    fgets(line, sizeof line, stdin);
    atomic_store(&running, 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    printf("%lld\n", waited_ns[0] + waited_ns[1]);
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) /* still there for the profiler to name its symbols */
        ;
    return 0;
}
