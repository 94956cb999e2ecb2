/* kvload: a pipelined, multi-threaded load generator for the memcached text
 * protocol, with cbc-pillowfight's options (options.c). Each thread drives
 * its connections from one epoll loop (drive.c); each connection sends a
 * batch of --batch-size requests at once (the sets as pipelined `set`s, the
 * gets as one multi-key `get`: batch.c), reads every reply, and starts the
 * next batch. What is sent is workload.c's: keys uniform or zipf, values
 * checkable with --verify.
 *
 * Latency of a request is the time from its batch being sent to its reply
 * being read, recorded in per-thread log-linear histograms (hist.c) that are
 * merged (counts added, never percentiles averaged) at the end. This file
 * runs the threads and reports. */
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "cpulist.h"
#include "loadgen/drive.h"
#include "loadgen/hist.h"
#include "loadgen/options.h"
#include "loadgen/thread.h"
#include "loadgen/workload.h"

static pthread_barrier_t populated, started;

static void *thread_main(void *arg)
{
    struct thread *t = arg;
    if (opt.ncpus > 0) {
        char who[32];
        snprintf(who, sizeof(who), "thread %d", t->idx);
        cpulist_pin_self(opt.cpus[t->idx % opt.ncpus], "kvload", who);
    }
    for (int i = 0; i < opt.connections; i++) {
        t->conns[i].fd = connect_server();
        if (t->conns[i].fd < 0)
            t->connect_failed = 1;
    }
    pthread_barrier_wait(&started); /* main checks connect_failed here */
    pthread_barrier_wait(&started);
    if (stop_flag)
        return NULL;
    if (!opt.no_population)
        drive(t, true);
    pthread_barrier_wait(&populated); /* main starts the clock */
    pthread_barrier_wait(&populated);
    if (!opt.populate_only)
        drive(t, false);
    return NULL;
}

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

/* The threads, each with its connections, seed and share of the keys to populate, started. */
static struct thread *start_threads(void)
{
    struct thread *threads = calloc((size_t)opt.threads, sizeof(*threads));
    pthread_barrier_init(&started, NULL, (unsigned)opt.threads + 1);
    pthread_barrier_init(&populated, NULL, (unsigned)opt.threads + 1);
    long share = (opt.num_items + opt.threads - 1) / opt.threads;
    for (int i = 0; i < opt.threads; i++) {
        struct thread *t = &threads[i];
        t->idx = i;
        t->rng = (opt.seed + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)i + 1) * 0xBF58476D1CE4E5B9ull;
        if (t->rng == 0)
            t->rng = 1;
        t->populate_from = i * share < opt.num_items ? i * share : opt.num_items;
        t->populate_to = (i + 1) * share < opt.num_items ? (i + 1) * share : opt.num_items;
        t->conns = calloc((size_t)opt.connections, sizeof(struct conn));
        for (int j = 0; j < opt.connections; j++)
            t->conns[j].get_keys = calloc((size_t)opt.batch, sizeof(long));
        pthread_create(&t->tid, NULL, thread_main, t);
    }
    return threads;
}

/* Once every thread tried to connect: false (and the threads joined) when one could not. */
static bool all_connected(struct thread *threads)
{
    pthread_barrier_wait(&started);
    int failed = 0;
    for (int i = 0; i < opt.threads; i++)
        failed |= threads[i].connect_failed;
    if (failed) {
        fprintf(stderr, "kvload: cannot connect to %s:%s: is the server running there?\n", opt.host, opt.port);
        stop_flag = 1;
    }
    pthread_barrier_wait(&started);
    if (failed) { /* the threads saw stop_flag and returned */
        for (int i = 0; i < opt.threads; i++)
            pthread_join(threads[i].tid, NULL);
    }
    return !failed;
}

/* Waits for the population, then starts the run's clock: its start, in ns. */
static uint64_t start_run(void)
{
    uint64_t pop_start = now_ns();
    pthread_barrier_wait(&populated);
    uint64_t t0 = now_ns();
    if (!opt.no_population && !opt.quiet && !opt.json)
        fprintf(stderr, "kvload: populated %ld keys in %.2f s\n", opt.num_items, (double)(t0 - pop_start) / 1e9);
    if (opt.duration > 0)
        run_deadline = t0 + (uint64_t)(opt.duration * 1e9);
    pthread_barrier_wait(&populated);
    return t0;
}

/* Joins the threads; on a terminal, prints the rate once a second meanwhile. */
static void join_threads(struct thread *threads, uint64_t t0)
{
    bool show = !opt.quiet && !opt.populate_only && isatty(STDERR_FILENO);
    bool *joined = calloc((size_t)opt.threads, sizeof(bool));
    uint64_t last_ops = 0, last_t = t0;
    for (int running = 1; running && show;) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        running = 0;
        for (int i = 0; i < opt.threads; i++) {
            if (!joined[i])
                joined[i] = pthread_tryjoin_np(threads[i].tid, NULL) == 0;
            running |= !joined[i];
        }
        uint64_t now = now_ns();
        if (now - last_t >= 1000000000ull) {
            uint64_t ops = 0;
            for (int i = 0; i < opt.threads; i++)
                ops += __atomic_load_n(&progress_ops[i], __ATOMIC_RELAXED);
            fprintf(stderr, "kvload: %5.1f s  %10.0f ops/s\n", (double)(now - t0) / 1e9,
                    (double)(ops - last_ops) / ((double)(now - last_t) / 1e9));
            last_ops = ops;
            last_t = now;
        }
    }
    for (int i = 0; i < opt.threads; i++)
        if (!joined[i])
            pthread_join(threads[i].tid, NULL);
    free(joined);
}

/* Every thread's counts and latencies added up; the threads' connections closed and freed. */
static void merge(struct thread *threads, struct counters *n, struct hist *all)
{
    for (int i = 0; i < opt.threads; i++) {
        struct thread *t = &threads[i];
        n->ops += t->n.ops;
        n->gets += t->n.gets;
        n->sets += t->n.sets;
        n->hits += t->n.hits;
        n->misses += t->n.misses;
        n->errors += t->n.errors;
        n->mismatches += t->n.mismatches;
        hist_merge(all, &t->hist);
        for (int j = 0; j < opt.connections; j++) {
            close(t->conns[j].fd);
            free(t->conns[j].out);
            free(t->conns[j].in);
            free(t->conns[j].get_keys);
        }
        free(t->conns);
    }
}

static void report(const struct counters *n, const struct hist *all, double secs)
{
    double ops_s = secs > 0 ? (double)n->ops / secs : 0;
    double p50 = (double)hist_pct(all, 0.50) / 1e3, p99 = (double)hist_pct(all, 0.99) / 1e3;
    double p999 = (double)hist_pct(all, 0.999) / 1e3, pmax = (double)all->max / 1e3;
    FILE *out = opt.json ? stderr : stdout;
    if (!opt.quiet || !opt.json) {
        fprintf(out, "kvload: %s:%s  %d thread(s) x %d conn(s), batch %d, %d%% sets, %ld keys\n", opt.host, opt.port,
                opt.threads, opt.connections, opt.batch, opt.set_pct, opt.num_items);
        fprintf(out, "  ops %llu in %.2f s = %.0f ops/s   gets %llu (hits %llu, misses %llu)   sets %llu\n",
                (unsigned long long)n->ops, secs, ops_s, (unsigned long long)n->gets, (unsigned long long)n->hits,
                (unsigned long long)n->misses, (unsigned long long)n->sets);
        fprintf(out, "  latency us  p50 %.1f  p99 %.1f  p99.9 %.1f  max %.1f   errors %llu   verify mismatches %llu\n",
                p50, p99, p999, pmax, (unsigned long long)n->errors, (unsigned long long)n->mismatches);
    }
    if (opt.json)
        printf("{\"ops\": %llu, \"ops_per_sec\": %.1f, \"gets\": %llu, \"sets\": %llu, \"hits\": %llu, "
               "\"misses\": %llu, \"errors\": %llu, \"verify_mismatches\": %llu, \"duration_s\": %.3f, "
               "\"latency_us\": {\"p50\": %.1f, \"p99\": %.1f, \"p999\": %.1f, \"max\": %.1f}, "
               "\"threads\": %d, \"connections\": %d, \"batch_size\": %d, \"set_pct\": %d, "
               "\"num_items\": %ld, \"verify\": %s}\n",
               (unsigned long long)n->ops, ops_s, (unsigned long long)n->gets, (unsigned long long)n->sets,
               (unsigned long long)n->hits, (unsigned long long)n->misses, (unsigned long long)n->errors,
               (unsigned long long)n->mismatches, secs, p50, p99, p999, pmax, opt.threads, opt.connections, opt.batch,
               opt.set_pct, opt.num_items, opt.verify ? "true" : "false");
}

static void report_populated(const struct counters *n)
{
    if (!opt.json)
        printf("kvload: populated %ld keys, %llu errors\n", opt.num_items, (unsigned long long)n->errors);
    else
        printf("{\"populated\": %ld, \"errors\": %llu}\n", opt.num_items, (unsigned long long)n->errors);
}

int main(int argc, char **argv)
{
    options_parse(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    if (opt.zipf_s > 0)
        zipf_setup();
    struct thread *threads = start_threads();
    if (!all_connected(threads))
        return 2;
    uint64_t t0 = start_run();
    join_threads(threads, t0);
    double secs = (double)(now_ns() - t0) / 1e9;
    struct counters n = {0};
    static struct hist all;
    merge(threads, &n, &all);
    if (!opt.populate_only)
        report(&n, &all, secs);
    else
        report_populated(&n);
    free(threads);
    zipf_teardown();
    return (n.errors || n.mismatches) ? 1 : 0;
}
