/* A client connection: its socket and buffers, the output helpers the
 * protocol writes replies with, and the callback table through which the
 * core hands input to the protocol layer (which it does not otherwise know).
 * Owned by exactly one worker thread. */
#ifndef KV_CONN_H
#define KV_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/ev.h"

#define RBUF_INITIAL 16384
#define WBUF_INITIAL 16384
/* Stop executing commands once this much output waits for the socket: a
 * client pipelining gets it does not read back cannot grow us unbounded. */
#define WBUF_HIGH_WATER (256 * 1024)

typedef struct conn {
    int fd;
    int idx;            /* the index of the worker that owns it */
    ev_loop_t *loop;    /* that worker's loop */
    struct conn **list; /* that worker's connections, linked by prev/next */
    bool closing;       /* flush what is pending, then close */
    uint32_t ev_mask;

    char *rbuf;
    size_t rsize, rlen, rpos; /* unparsed input is rbuf[rpos..rlen) */
    char *wbuf;
    size_t wsize, wlen, wsent; /* unsent output is wbuf[wsent..wlen) */

    void *data; /* the protocol's state of the connection (conn_handler.open) */

    struct conn *prev, *next;
} conn;

/* What the core calls in the protocol layer: the protocol fills one in and
 * main.c registers it with conn_set_handler() before the workers start.
 * Each function runs on the worker thread that owns the connection. The
 * contract is written out in docs/server.md. */
struct conn_handler {
    size_t rbuf_max; /* the read buffer grows up to this many bytes, no more */
    /* A connection was accepted: set up c->data. -1 refuses the connection. */
    int (*open)(conn *c);
    /* Input arrived (rbuf[rpos..rlen)): consume what it can and append the
     * replies with out_*(). Returns 1 to be called again once the output
     * has been written, 0 when it needs more input or c->closing is set. */
    int (*process)(conn *c);
    /* All output appended so far has been written to the socket. */
    void (*sent)(conn *c);
    /* The connection is going away (also after a failed open): release
     * c->data. */
    void (*close)(conn *c);
};
void conn_set_handler(const struct conn_handler *h);

/* A connection on `fd` owned by the worker `idx`, served by `loop` and
 * linked at the head of *list; NULL if it could not be set up. */
conn *conn_new(int fd, ev_loop_t *loop, int idx, conn **list);
void conn_close(conn *c);
void conn_event(conn *c, uint32_t mask);

/* Room for n more bytes of output; NULL (and c->closing set) when memory
 * ran out. */
char *out_reserve(conn *c, size_t n);
void out_add(conn *c, const void *p, size_t n);
void out_str(conn *c, const char *s);
void out_printf(conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline size_t out_pending(const conn *c) { return c->wlen - c->wsent; }

uint64_t conns_current(void);
uint64_t conns_total(void);
uint64_t conns_rejected(void);
void conns_count_open(void);
void conns_count_rejected(void);
void conns_count_closed_early(void); /* counted open, closed before serving */

/* Bytes read from and written to every client socket so far (the `stats`
 * bytes_read and bytes_written). */
struct conn_io {
    uint64_t bytes_read;
    uint64_t bytes_written;
};
void conns_io(struct conn_io *sum);

#endif
