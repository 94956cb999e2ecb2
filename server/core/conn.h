/* A client connection: its buffers, the state of the command in progress,
 * and the output helpers the protocol writes replies with. Owned by exactly
 * one worker thread. */
#ifndef KV_CONN_H
#define KV_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/opcodes.h"
#include "storage/item.h"
#include "storage/items.h"

#define RBUF_INITIAL 16384
#define WBUF_INITIAL 16384
/* Stop executing commands once this much output waits for the socket: a
 * client pipelining gets it does not read back cannot grow us unbounded. */
#define WBUF_HIGH_WATER (256 * 1024)

struct worker;

enum conn_state {
    CONN_PARSE,   /* expecting a command line */
    CONN_NREAD,   /* reading a storage command's value into c->item */
    CONN_SWALLOW, /* discarding the value of a refused storage command */
    CONN_CLOSING, /* flush what is pending, then close */
};

typedef struct conn {
    int fd;
    struct worker *worker;
    enum conn_state state;
    uint32_t ev_mask;

    char *rbuf;
    size_t rsize, rlen, rpos; /* unparsed input is rbuf[rpos..rlen) */
    char *wbuf;
    size_t wsize, wlen, wsent; /* unsent output is wbuf[wsent..wlen) */

    /* the storage command whose value is being read */
    item *item;
    uint64_t nread_left;
    uint64_t swallow_left;
    enum store_op store_op;
    enum opcode op;
    uint64_t cas_in;
    uint64_t hv;
    bool noreply;
    uint64_t op_start;

    /* a get whose key list is being walked (paused when output is high) */
    bool get_active;
    enum opcode get_op;
    size_t get_pos, get_len, get_line_len;
    const char *get_keys;
    uint64_t gat_exp;

    /* item objects copied out for replies still in wbuf (see docs/kvcached.md) */
    uint64_t copies;
    int64_t copy_bytes;

    struct conn *prev, *next; /* the worker's connections */
} conn;

conn *conn_new(int fd, struct worker *w);
void conn_close(conn *c);
void conn_event(conn *c, uint32_t mask);

/* Room for n more bytes of output; NULL (and the connection set to close)
 * when memory ran out. */
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

#endif
