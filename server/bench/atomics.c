/* atomics: the study's counter experiment. N pinned threads increment a
 * counter as fast as they can for a fixed time, in one of four designs:
 *
 *   shared        one atomic word, fetch_add from every thread (lock xadd on
 *                 a line that bounces between cores)
 *   false-shared  one atomic word per thread, all in the same cache line
 *   padded        one atomic word per thread, each on its own cache line
 *   local         one plain per-thread counter (load + store, no lock
 *                 prefix), as kvcached's per-thread sites
 *   pingpong      two threads hand one cache line back and forth; ns_per_op
 *                 is the round trip (kvprof bench reads it around every run:
 *                 on a VM it says where the host put the CPUs)
 *   handoff       two threads hand a pthread mutex back and forth, each holding
 *                 it --hold-ns before it unlocks while the other sleeps in the
 *                 futex wait: ns_per_op is the hand-off, from the unlock to the
 *                 sleeper holding the lock (the futex wake and the waiter's
 *                 wake-up a contended sleeping mutex pays; kvprof's critical
 *                 section model reads it)
 *
 * --realtime runs the threads at SCHED_FIFO and the timer above them, so that
 * a probe on a busy machine measures the line, not the scheduler (root).
 *
 * Prints one line per run, or JSON lines with --json. kvprof bench
 * --scenario atomics runs the matrix and picks the CPUs (same socket or
 * across sockets) from the topology. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EX_USAGE 64
#define MAX_THREADS 256

enum mode { SHARED, FALSE_SHARED, PADDED, LOCAL, PINGPONG, HANDOFF, MODES };
static const char *const mode_names[MODES] = {"shared", "false-shared", "padded", "local", "pingpong", "handoff"};

static uint64_t shared_word __attribute__((aligned(64)));
static uint64_t same_line[8] __attribute__((aligned(64)));
static struct {
    uint64_t v;
} __attribute__((aligned(64))) padded_words[MAX_THREADS];

static volatile int go, stop;

/* handoff: the mutex, who took it last, when it was released, the hold */
static pthread_mutex_t handoff_mutex = PTHREAD_MUTEX_INITIALIZER;
static int last_owner = -1;
static uint64_t released_ns;
static uint64_t hold_ns = 10000;

struct worker {
    pthread_t tid;
    int idx, cpu;
    enum mode mode;
    uint64_t ops, handoff_ns, wake_ns;
} __attribute__((aligned(64)));

static uint64_t clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Each thread takes the mutex, holds it hold_ns, releases it, then waits until
 * the other has taken it before it asks again: the other asked while it was
 * held, so it was asleep in the futex wait, and every acquisition is a
 * hand-off to a sleeper. Only this thread writes last_owner and released_ns
 * while it holds the mutex; the mutex orders them. */
static void handoff(struct worker *w)
{
    uint64_t n = 0, sum = 0, wakes = 0;
    while (!stop) {
        pthread_mutex_lock(&handoff_mutex);
        uint64_t t = clock_ns();
        if (__atomic_load_n(&last_owner, __ATOMIC_RELAXED) == 1 - w->idx) {
            sum += t - released_ns;
            n++;
        }
        __atomic_store_n(&last_owner, w->idx, __ATOMIC_RELEASE);
        while (clock_ns() - t < hold_ns && !stop)
            ;
        uint64_t released = clock_ns();
        released_ns = released;
        pthread_mutex_unlock(&handoff_mutex);
        wakes += clock_ns() - released;
        while (__atomic_load_n(&last_owner, __ATOMIC_ACQUIRE) == w->idx && !stop)
            ;
    }
    w->ops = n;
    w->handoff_ns = sum;
    w->wake_ns = wakes;
}

static void *run(void *arg)
{
    struct worker *w = arg;
    if (w->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(w->cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    }
    uint64_t *p = w->mode == SHARED         ? &shared_word
                  : w->mode == FALSE_SHARED ? &same_line[w->idx % 8]
                                            : &padded_words[w->idx].v;
    uint64_t local = 0, n = 0;
    while (!go)
        ;
    if (w->mode == HANDOFF) {
        handoff(w);
        return NULL;
    }
    if (w->mode == PINGPONG) {
        /* thread 0 writes odd values and waits for the next even one, thread 1
         * answers each odd value: every step moves the line to the other core */
        uint64_t mine = 1;
        while (!stop) {
            if (w->idx == 0)
                __atomic_store_n(&shared_word, mine, __ATOMIC_RELEASE);
            uint64_t want = w->idx == 0 ? mine + 1 : mine;
            while (__atomic_load_n(&shared_word, __ATOMIC_ACQUIRE) != want && !stop)
                ;
            if (w->idx == 1)
                __atomic_store_n(&shared_word, mine + 1, __ATOMIC_RELEASE);
            mine += 2;
            n += w->idx == 0;
        }
        w->ops = n;
        return NULL;
    }
    while (!stop) {
        for (int i = 0; i < 1024; i++) {
            switch (w->mode) {
            case SHARED:
            case FALSE_SHARED:
            case PADDED:
                __atomic_fetch_add(p, 1, __ATOMIC_RELAXED);
                break;
            case PINGPONG:
            case HANDOFF:
                break;
            case LOCAL:
                /* a store the compiler must keep, without a lock prefix */
                __atomic_store_n(&local, __atomic_load_n(&local, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
                break;
            case MODES:
                break;
            }
        }
        n += 1024;
    }
    w->ops = n;
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: atomics --mode shared|false-shared|padded|local|pingpong|handoff --threads N\n"
                 "               [--cpus 0,1,...] [--duration-ms MS] [--hold-ns NS] [--realtime] [--json]\n");
}

int main(int argc, char **argv)
{
    enum mode mode = MODES;
    int threads = 1, ms = 500, json = 0, realtime = 0, ncpus = 0, cpus[MAX_THREADS];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--realtime") == 0) {
            realtime = 1;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (v == NULL) {
            usage(stderr);
            return EX_USAGE;
        } else if (strcmp(a, "--mode") == 0) {
            for (int m = 0; m < MODES; m++)
                if (strcmp(v, mode_names[m]) == 0)
                    mode = (enum mode)m;
            i++;
        } else if (strcmp(a, "--threads") == 0) {
            threads = atoi(v);
            i++;
        } else if (strcmp(a, "--hold-ns") == 0) {
            hold_ns = (uint64_t)strtoull(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--duration-ms") == 0) {
            ms = atoi(v);
            i++;
        } else if (strcmp(a, "--cpus") == 0) {
            char *copy = strdup(v), *save = NULL;
            for (char *tok = strtok_r(copy, ",", &save); tok && ncpus < MAX_THREADS; tok = strtok_r(NULL, ",", &save))
                cpus[ncpus++] = atoi(tok);
            free(copy);
            i++;
        } else {
            usage(stderr);
            return EX_USAGE;
        }
    }
    if (mode == MODES || threads < 1 || threads > MAX_THREADS || ms < 10 || ((mode == PINGPONG || mode == HANDOFF) && threads != 2)) {
        fprintf(stderr, "atomics: need --mode (shared, false-shared, padded, local, pingpong, handoff), "
                        "1 <= --threads <= %d (pingpong, handoff: 2), --duration-ms >= 10\n", MAX_THREADS);
        return EX_USAGE;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (realtime) { /* the timer (this thread) preempts the workers when the window ends */
        struct sched_param timer = {.sched_priority = 2}, worker = {.sched_priority = 1};
        int err = pthread_setschedparam(pthread_self(), SCHED_FIFO, &timer);
        if (err == 0) {
            pthread_attr_setinheritsched(&attr, PTHREAD_EXPLICIT_SCHED);
            pthread_attr_setschedpolicy(&attr, SCHED_FIFO);
            pthread_attr_setschedparam(&attr, &worker);
        } else {
            fprintf(stderr, "atomics: --realtime: %s (needs root or CAP_SYS_NICE)\n", strerror(err));
            return 1;
        }
    }
    struct worker *w = aligned_alloc(64, sizeof(*w) * (size_t)threads);
    memset(w, 0, sizeof(*w) * (size_t)threads);
    for (int i = 0; i < threads; i++) {
        w[i].idx = i;
        w[i].mode = mode;
        w[i].cpu = ncpus ? cpus[i % ncpus] : -1;
        pthread_create(&w[i].tid, &attr, run, &w[i]);
    }
    pthread_attr_destroy(&attr);
    usleep(20000); /* let every thread reach its CPU */
    double t0 = now_s();
    go = 1;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    stop = 1;
    double secs = now_s() - t0;
    uint64_t total = 0, handoffs_ns = 0, wakes_ns = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(w[i].tid, NULL);
        total += w[i].ops;
        handoffs_ns += w[i].handoff_ns;
        wakes_ns += w[i].wake_ns;
    }
    /* a thread that got no CPU at all in the window (a busy machine) counts
     * 0: report it rather than dividing by zero (inf is not JSON) */
    double ops_s = (double)total / secs, ns_op = total ? secs * 1e9 * threads / (double)total : 0.0;
    if (mode == PINGPONG) /* round trips per second; ns per round trip */
        ns_op = total ? secs * 1e9 / (double)total : 0.0;
    if (mode == HANDOFF) /* hand-offs per second; ns from an unlock to the sleeper holding it */
        ns_op = total ? (double)handoffs_ns / (double)total : 0.0;
    char cpulist[512] = "";
    for (int i = 0; i < threads && ncpus; i++) {
        size_t len = strlen(cpulist);
        snprintf(cpulist + len, sizeof(cpulist) - len, "%s%d", i ? "," : "", w[i].cpu);
    }
    /* handoff: also the unlocker's own time in the unlock that wakes the sleeper */
    double wake = mode == HANDOFF && total ? (double)wakes_ns / (double)total : 0.0;
    if (json && mode == HANDOFF)
        printf("{\"mode\": \"%s\", \"threads\": %d, \"cpus\": \"%s\", \"ops_per_sec\": %.0f, \"ns_per_op\": %.2f, "
               "\"hold_ns\": %llu, \"wake_ns\": %.2f}\n",
               mode_names[mode], threads, cpulist, ops_s, ns_op, (unsigned long long)hold_ns, wake);
    else if (json)
        printf("{\"mode\": \"%s\", \"threads\": %d, \"cpus\": \"%s\", \"ops_per_sec\": %.0f, \"ns_per_op\": %.2f}\n",
               mode_names[mode], threads, cpulist, ops_s, ns_op);
    else if (mode == HANDOFF)
        printf("%-13s threads %-3d cpus %-10s %14.0f ops/s  %7.2f ns per hand-off, %.2f ns in the waking unlock\n",
               mode_names[mode], threads, ncpus ? cpulist : "any", ops_s, ns_op, wake);
    else
        printf("%-13s threads %-3d cpus %-10s %14.0f ops/s  %7.2f ns/op per thread\n", mode_names[mode], threads,
               ncpus ? cpulist : "any", ops_s, ns_op);
    free(w);
    return 0;
}
