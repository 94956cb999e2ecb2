#include "core/ev.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

struct ev_loop {
    int epfd;
    int max_events;
    struct epoll_event *events;
    ev_fired_t *fired;
};

ev_loop_t *ev_create(int max_events)
{
    ev_loop_t *loop = calloc(1, sizeof(*loop));
    if (loop == NULL)
        return NULL;
    loop->epfd = epoll_create1(EPOLL_CLOEXEC);
    loop->max_events = max_events;
    loop->events = calloc((size_t)max_events, sizeof(*loop->events));
    loop->fired = calloc((size_t)max_events, sizeof(*loop->fired));
    if (loop->epfd < 0 || loop->events == NULL || loop->fired == NULL) {
        ev_destroy(loop);
        return NULL;
    }
    return loop;
}

void ev_destroy(ev_loop_t *loop)
{
    if (loop == NULL)
        return;
    if (loop->epfd >= 0)
        close(loop->epfd);
    free(loop->events);
    free(loop->fired);
    free(loop);
}

static uint32_t to_epoll(uint32_t mask)
{
    return ((mask & EV_READ) ? EPOLLIN : 0u) | ((mask & EV_WRITE) ? EPOLLOUT : 0u);
}

static int ctl(ev_loop_t *loop, int op, int fd, uint32_t mask, void *data)
{
    struct epoll_event ee = {.events = to_epoll(mask), .data.ptr = data};
    return epoll_ctl(loop->epfd, op, fd, &ee);
}

int ev_add(ev_loop_t *loop, int fd, uint32_t mask, void *data)
{
    return ctl(loop, EPOLL_CTL_ADD, fd, mask, data);
}

int ev_mod(ev_loop_t *loop, int fd, uint32_t mask, void *data)
{
    return ctl(loop, EPOLL_CTL_MOD, fd, mask, data);
}

void ev_del(ev_loop_t *loop, int fd) { epoll_ctl(loop->epfd, EPOLL_CTL_DEL, fd, NULL); }

int ev_wait(ev_loop_t *loop, int timeout_ms, ev_fired_t **fired)
{
    int n;
    do {
        n = epoll_wait(loop->epfd, loop->events, loop->max_events, timeout_ms);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        fprintf(stderr, "kvcached: epoll_wait: %s\n", strerror(errno));
        abort();
    }
    for (int i = 0; i < n; i++) {
        uint32_t e = loop->events[i].events;
        uint32_t mask = 0;
        if (e & EPOLLIN)
            mask |= EV_READ;
        if (e & EPOLLOUT)
            mask |= EV_WRITE;
        if (e & (EPOLLERR | EPOLLHUP))
            mask |= EV_READ | EV_WRITE;
        loop->fired[i].data = loop->events[i].data.ptr;
        loop->fired[i].mask = mask;
    }
    *fired = loop->fired;
    return n;
}
