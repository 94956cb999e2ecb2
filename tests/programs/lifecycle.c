/* Targets whose threads and processes come and go (tests/test_lifecycle.py).
 *
 *   lifecycle threads N SECONDS   N threads ("worker-I"), each waking every 50 ms
 *                                 to spin briefly in spin_worker()
 *   lifecycle churn SECONDS       short-lived threads ("short"), a few at a time,
 *                                 each spinning ~5 ms in spin_short() then exiting
 *   lifecycle fork SECONDS        spins in spin_parent(); every 200 ms forks a child
 *                                 that spins in spin_child() for 300 ms and exits; a
 *                                 line "long" on stdin forks one that spins until the
 *                                 parent ends, and prints "long PID"
 *   lifecycle exec SECONDS        spins in spin_before_exec() until a line "exec" comes
 *                                 on stdin, then execs itself as `lifecycle spin SECONDS`
 *   lifecycle spin SECONDS        spins in spin_after_exec()
 *
 * Every spin fires the kvs lock probes around it when they are enabled (built with
 * server/build/kvs.h and kvs_probes.o), so the target carries kvs semaphores that a
 * fork copies. Prints "ready" once set up; exits when its stdin is closed or after
 * SECONDS, whichever is first.
 *
 * Built by the test with: cc -O1 -g -fno-omit-frame-pointer -pthread -Iserver/build
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvs.h"

static atomic_int stop;
static atomic_int exec_now;
static atomic_int fork_long;

unsigned long spin_worker(unsigned long n);
unsigned long spin_short(unsigned long n);
unsigned long spin_parent(unsigned long n);
unsigned long spin_child(unsigned long n);
unsigned long spin_before_exec(unsigned long n);
unsigned long spin_after_exec(unsigned long n);

static unsigned long spin(unsigned long n)
{
    volatile unsigned long x = 0;
    if (KVS_LOCK_WAIT_START_ENABLED())
        KVS_LOCK_WAIT_START((void *)&stop, (char *)"lifecycle");
    for (unsigned long i = 0; i < n; i++)
        x += i * 7;
    if (KVS_LOCK_WAIT_DONE_ENABLED())
        KVS_LOCK_WAIT_DONE((void *)&stop, (char *)"lifecycle", 20000, 1);
    return x;
}

/* one function per phase, so each is named in the stacks */
__attribute__((noinline)) unsigned long spin_worker(unsigned long n) { return spin(n) + 1; }
__attribute__((noinline)) unsigned long spin_short(unsigned long n) { return spin(n) + 2; }
__attribute__((noinline)) unsigned long spin_parent(unsigned long n) { return spin(n) + 3; }
__attribute__((noinline)) unsigned long spin_child(unsigned long n) { return spin(n) + 4; }
__attribute__((noinline)) unsigned long spin_before_exec(unsigned long n) { return spin(n) + 5; }
__attribute__((noinline)) unsigned long spin_after_exec(unsigned long n) { return spin(n) + 6; }

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *stdin_watch(void *arg)
{
    (void)arg;
    struct pollfd p = {.fd = 0, .events = POLLIN};
    char buf[64];
    for (;;) {
        if (poll(&p, 1, -1) <= 0)
            continue;
        ssize_t n = read(0, buf, sizeof buf - 1);
        if (n <= 0)
            break;
        buf[n] = 0;
        if (strstr(buf, "exec"))
            atomic_store(&exec_now, 1);
        if (strstr(buf, "long"))
            atomic_store(&fork_long, 1);
    }
    atomic_store(&stop, 1);
    return NULL;
}

static void *worker(void *arg)
{
    char name[16];
    snprintf(name, sizeof name, "worker-%d", (int)(long)arg);
    pthread_setname_np(pthread_self(), name);
    while (!atomic_load(&stop)) {
        spin_worker(20000);
        nap_ms(50);
    }
    return NULL;
}

static void *short_lived(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "short");
    double end = now() + 0.005;
    while (now() < end)
        spin_short(10000);
    return NULL;
}

static void run_threads(int n, double deadline)
{
    pthread_t *tids = calloc((size_t)n, sizeof *tids);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    for (int i = 0; i < n; i++)
        if (pthread_create(&tids[i], &attr, worker, (void *)(long)i) != 0) {
            perror("pthread_create");
            exit(1);
        }
    printf("ready\n");
    fflush(stdout);
    while (!atomic_load(&stop) && now() < deadline)
        nap_ms(50);
    atomic_store(&stop, 1);
    for (int i = 0; i < n; i++)
        pthread_join(tids[i], NULL);
    free(tids);
}

static void run_churn(double deadline)
{
    printf("ready\n");
    fflush(stdout);
    while (!atomic_load(&stop) && now() < deadline) {
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, short_lived, NULL);
        for (int i = 0; i < 4; i++)
            pthread_join(t[i], NULL);
        nap_ms(10);
    }
}

static void run_fork(double deadline)
{
    printf("ready\n");
    fflush(stdout);
    double next = now();
    pid_t parent = getpid(), long_child = 0;
    while (!atomic_load(&stop) && now() < deadline) {
        if (atomic_exchange(&fork_long, 0) && !long_child) {
            long_child = fork();
            if (long_child == 0) {
                while (getppid() == parent)
                    spin_child(20000);
                _exit(0);
            }
            printf("long %d\n", (int)long_child);
            fflush(stdout);
        }
        if (now() >= next) {
            next = now() + 0.2;
            pid_t child = fork();
            if (child == 0) {
                double end = now() + 0.3;
                while (now() < end)
                    spin_child(20000);
                _exit(0);
            }
        }
        spin_parent(20000);
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
    }
    if (long_child > 0)
        kill(long_child, SIGKILL);
    while (wait(NULL) > 0)
        ;
}

static void run_spin(double deadline, int before_exec)
{
    while (!atomic_load(&stop) && !atomic_load(&exec_now) && now() < deadline) {
        if (before_exec)
            spin_before_exec(200000);
        else
            spin_after_exec(200000);
        nap_ms(1);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: lifecycle threads N SECONDS | churn|fork|exec|spin SECONDS\n");
        return 2;
    }
    const char *mode = argv[1];
    int threads = !strcmp(mode, "threads");
    double seconds = atof(argv[threads ? 3 : 2]);
    double deadline = now() + seconds;
    pthread_t watch;
    pthread_create(&watch, NULL, stdin_watch, NULL);
    pthread_detach(watch);
    if (threads) {
        run_threads(atoi(argv[2]), deadline);
    } else if (!strcmp(mode, "churn")) {
        run_churn(deadline);
    } else if (!strcmp(mode, "fork")) {
        run_fork(deadline);
    } else if (!strcmp(mode, "exec")) {
        printf("ready\n");
        fflush(stdout);
        run_spin(deadline, 1);
        if (atomic_load(&exec_now)) {
            char *args[] = {argv[0], (char *)"spin", argv[2], NULL};
            execv("/proc/self/exe", args);
            perror("execv");
            return 1;
        }
    } else if (!strcmp(mode, "spin")) {
        run_spin(deadline, 0);
    } else {
        fprintf(stderr, "lifecycle: unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
