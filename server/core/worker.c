#include "core/worker.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cpulist.h"
#include "settings.h"

__thread int kv_thread_idx;

static worker_t *workers;
static int nworkers;
static unsigned next_worker;
static int stopping;
static int nready; /* workers that have named (and pinned) themselves */

#define MAX_EVENTS 256

static void wake(worker_t *w)
{
    uint64_t one = 1;
    while (write(w->wakefd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
}

static void take_new_conns(worker_t *w)
{
    int fds[64];
    for (;;) {
        size_t n = 0;
        kv_lock(&w->qlock);
        while (n < KV_ARRAY_LEN(fds) && w->qlen > 0)
            fds[n++] = w->queue[--w->qlen];
        kv_unlock(&w->qlock);
        if (n == 0)
            return;
        for (size_t i = 0; i < n; i++) {
            if (conn_new(fds[i], w->loop, w->idx, &w->conns) == NULL) {
                close(fds[i]);
                conns_count_closed_early();
            }
        }
    }
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    char name[16];
    kv_thread_idx = w->idx;
    snprintf(name, sizeof(name), "kv-worker-%d", w->idx);
    pthread_setname_np(pthread_self(), name);
    if (settings.ncpus > 0)
        cpulist_pin_self(settings.cpus[w->idx % settings.ncpus], "kvcached", name);
    __atomic_add_fetch(&nready, 1, __ATOMIC_RELEASE);

    while (!__atomic_load_n(&stopping, __ATOMIC_ACQUIRE)) {
        ev_fired_t *fired;
        int n = ev_wait(w->loop, -1, &fired);
        for (int i = 0; i < n; i++) {
            if (fired[i].data == NULL) { /* the wake eventfd */
                uint64_t v;
                while (read(w->wakefd, &v, sizeof(v)) < 0 && errno == EINTR)
                    ;
                take_new_conns(w);
                continue;
            }
            conn_event(fired[i].data, fired[i].mask);
        }
    }
    while (w->conns != NULL)
        conn_close(w->conns);
    return NULL;
}

int workers_setup(int n)
{
    workers = calloc((size_t)n, sizeof(*workers));
    if (workers == NULL)
        return -1;
    nworkers = n;
    for (int i = 0; i < n; i++) {
        worker_t *w = &workers[i];
        w->idx = i;
        w->loop = ev_create(MAX_EVENTS);
        w->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        lock_init(&w->qlock, LOCK_CONNQ);
        if (w->loop == NULL || w->wakefd < 0 || ev_add(w->loop, w->wakefd, EV_READ, NULL) != 0)
            return -1;
    }
    return 0;
}

int workers_start(void)
{
    int started = 0, status = 0;
    for (; started < nworkers; started++) {
        int err = pthread_create(&workers[started].thread, NULL, worker_main, &workers[started]);
        if (err != 0) {
            fprintf(stderr, "kvcached: cannot start worker %d: %s\n", started, strerror(err));
            status = -1;
            break;
        }
    }
    /* Returns once every worker started carries its name (and its CPU, with
     * --cpu-affinity): what reads the threads as soon as the server says it listens
     * (kvprof at attach, a test that pins them) finds them all. */
    while (__atomic_load_n(&nready, __ATOMIC_ACQUIRE) < started)
        sched_yield();
    return status;
}

int workers_dispatch(int fd)
{
    worker_t *w = &workers[next_worker++ % (unsigned)nworkers];
    kv_lock(&w->qlock);
    if (w->qlen == w->qcap) {
        size_t cap = w->qcap ? w->qcap * 2 : 64;
        int *q = realloc(w->queue, cap * sizeof(int));
        if (q == NULL) {
            kv_unlock(&w->qlock);
            return -1;
        }
        w->queue = q;
        w->qcap = cap;
    }
    w->queue[w->qlen++] = fd;
    kv_unlock(&w->qlock);
    wake(w);
    return 0;
}

void workers_stop(void)
{
    __atomic_store_n(&stopping, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < nworkers; i++)
        wake(&workers[i]);
    for (int i = 0; i < nworkers; i++)
        if (workers[i].thread)
            pthread_join(workers[i].thread, NULL);
}

void workers_teardown(void)
{
    for (int i = 0; workers != NULL && i < nworkers; i++) {
        worker_t *w = &workers[i];
        for (size_t j = 0; j < w->qlen; j++) { /* handed over but never taken */
            close(w->queue[j]);
            conns_count_closed_early();
        }
        free(w->queue);
        if (w->wakefd >= 0)
            close(w->wakefd);
        ev_destroy(w->loop);
        lock_destroy(&w->qlock);
    }
    free(workers);
    workers = NULL;
}
