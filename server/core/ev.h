/* A thin event-loop API over one epoll instance. Errors and hang-ups are
 * folded into EV_READ|EV_WRITE so handlers see them as a read or write that
 * fails; EINTR is retried; anything else is fatal and says so. */
#ifndef KV_EV_H
#define KV_EV_H

#include <stdint.h>

#define EV_READ 1u
#define EV_WRITE 2u

typedef struct ev_loop ev_loop_t;

typedef struct ev_fired {
    void *data;
    uint32_t mask;
} ev_fired_t;

ev_loop_t *ev_create(int max_events);
void ev_destroy(ev_loop_t *loop);
int ev_add(ev_loop_t *loop, int fd, uint32_t mask, void *data);
int ev_mod(ev_loop_t *loop, int fd, uint32_t mask, void *data);
void ev_del(ev_loop_t *loop, int fd);
/* Waits up to timeout_ms (-1: forever); returns the number of fired events
 * stored in *fired (valid until the next call). */
int ev_wait(ev_loop_t *loop, int timeout_ms, ev_fired_t **fired);

#endif
