#include "loadgen/drive.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loadgen/batch.h"
#include "loadgen/options.h"
#include "loadgen/workload.h"

volatile int stop_flag;
uint64_t run_deadline;
uint64_t progress_ops[256];

int connect_server(void)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    if (getaddrinfo(opt.host, opt.port, &hints, &res) != 0)
        return -1;
    int fd = -1;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    return fd;
}

static bool finished(struct conn *c)
{
    if (stop_flag)
        return true;
    if (run_deadline && now_ns() >= run_deadline)
        return true;
    return opt.num_cycles >= 0 && c->cycles >= opt.num_cycles;
}

/* One drive(): the thread, its epoll loop, what it does and how far it got. */
struct run {
    struct thread *t;
    int ep;
    bool populate;
    long next_key; /* populating: the next key to store */
    int active;    /* connections not done */
};

static bool run_over(struct run *r, struct conn *c)
{
    return r->populate ? r->next_key >= r->t->populate_to : finished(c);
}

static void next_batch(struct run *r, struct conn *c)
{
    if (r->populate)
        build_populate(r->t, c, &r->next_key);
    else
        build_batch(r->t, c);
}

static void watch(struct run *r, struct conn *c, int op, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = c};
    epoll_ctl(r->ep, op, c->fd, &ev);
}

static void conn_done(struct run *r, struct conn *c)
{
    c->done = true;
    epoll_ctl(r->ep, EPOLL_CTL_DEL, c->fd, NULL);
    r->active--;
}

/* Every connection's first batch, or done at once when there is nothing to do. */
static void start(struct run *r)
{
    for (int i = 0; i < opt.connections; i++) {
        struct conn *c = &r->t->conns[i];
        c->done = false;
        c->cycles = 0;
        c->in_len = 0;
        if (run_over(r, c)) {
            c->done = true;
            continue;
        }
        next_batch(r, c);
        watch(r, c, EPOLL_CTL_ADD, EPOLLIN | EPOLLOUT);
        r->active++;
    }
}

/* Sends what is left of the batch. -1: the connection failed. */
static int on_writable(struct run *r, struct conn *c)
{
    ssize_t w = send(c->fd, c->out + c->out_sent, c->out_len - c->out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno != EAGAIN && errno != EINTR)
        return -1;
    if (w > 0)
        c->out_sent += (size_t)w;
    if (c->out_sent == c->out_len)
        watch(r, c, EPOLL_CTL_MOD, EPOLLIN);
    return 0;
}

/* The batch was answered: the next one, sent at once. Waiting for EPOLLOUT
 * first costs two epoll_ctl calls and a wake-up per batch, which made
 * unbatched kvload slower than memcaslap (docs/bench-results.md); only a full
 * socket buffer waits for writability. -1: the connection failed. */
static int on_answered(struct run *r, struct conn *c)
{
    c->cycles++;
    if (run_over(r, c)) {
        conn_done(r, c);
        return 0;
    }
    next_batch(r, c);
    ssize_t w = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno != EAGAIN && errno != EINTR)
        return -1;
    if (w > 0)
        c->out_sent = (size_t)w;
    if (c->out_sent < c->out_len)
        watch(r, c, EPOLL_CTL_MOD, EPOLLIN | EPOLLOUT);
    return 0;
}

/* Reads what arrived and parses it. -1: the connection failed. */
static int on_readable(struct run *r, struct conn *c)
{
    if (c->in_cap - c->in_len < 65536) {
        c->in_cap = c->in_cap ? c->in_cap * 2 : 262144;
        c->in = realloc(c->in, c->in_cap);
        if (c->in == NULL) {
            fprintf(stderr, "kvload: out of memory\n");
            exit(1);
        }
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
        return -1;
    if (n > 0)
        c->in_len += (size_t)n;
    int done = parse_replies(r->t, c, !r->populate);
    if (done < 0 || (done == 1 && on_answered(r, c) < 0))
        return -1;
    if (!c->done)
        __atomic_store_n(&progress_ops[r->t->idx], r->t->n.ops, __ATOMIC_RELAXED);
    return 0;
}

static void on_event(struct run *r, struct conn *c, uint32_t events)
{
    if ((events & EPOLLOUT) && c->out_sent < c->out_len && on_writable(r, c) < 0)
        goto failed;
    if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) && on_readable(r, c) < 0)
        goto failed;
    return;
failed:
    r->t->n.errors++;
    if (!opt.quiet)
        fprintf(stderr, "kvload: connection lost (%s)\n", errno ? strerror(errno) : "closed by server");
    conn_done(r, c);
}

void drive(struct thread *t, bool populate)
{
    struct run r = {.t = t, .ep = epoll_create1(EPOLL_CLOEXEC), .populate = populate, .next_key = t->populate_from};
    start(&r);
    struct epoll_event events[64];
    while (r.active > 0) {
        int n = epoll_wait(r.ep, events, 64, 200);
        if (n < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            if (!c->done)
                on_event(&r, c, events[i].events);
        }
    }
    close(r.ep);
}
