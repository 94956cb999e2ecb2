#include "core/conn.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "settings.h"
#include "trace.h"
#include "util.h"

static uint64_t curr_conns, total_conns, rejected_conns;
/* Bytes through the sockets, one block per worker (written only by its
 * worker, with plain loads and stores: no line is shared between workers). */
static struct {
    struct conn_io n;
} KV_ALIGNED io[KV_MAX_THREADS + 1];
static const struct conn_handler *handler;

void conn_set_handler(const struct conn_handler *h) { handler = h; }

uint64_t conns_current(void) { return __atomic_load_n(&curr_conns, __ATOMIC_RELAXED); }
uint64_t conns_total(void) { return __atomic_load_n(&total_conns, __ATOMIC_RELAXED); }
uint64_t conns_rejected(void) { return __atomic_load_n(&rejected_conns, __ATOMIC_RELAXED); }

void conns_count_open(void)
{
    __atomic_fetch_add(&curr_conns, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&total_conns, 1, __ATOMIC_RELAXED);
}

void conns_count_rejected(void) { __atomic_fetch_add(&rejected_conns, 1, __ATOMIC_RELAXED); }

void conns_count_closed_early(void) { __atomic_fetch_sub(&curr_conns, 1, __ATOMIC_RELAXED); }

static inline void io_add(uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
}

void conns_io(struct conn_io *sum)
{
    sum->bytes_read = sum->bytes_written = 0;
    for (size_t w = 0; w < KV_ARRAY_LEN(io); w++) {
        sum->bytes_read += __atomic_load_n(&io[w].n.bytes_read, __ATOMIC_RELAXED);
        sum->bytes_written += __atomic_load_n(&io[w].n.bytes_written, __ATOMIC_RELAXED);
    }
}

conn *conn_new(int fd, ev_loop_t *loop, int idx, conn **list)
{
    conn *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->fd = fd;
    c->idx = idx;
    c->loop = loop;
    c->list = list;
    c->rsize = RBUF_INITIAL;
    c->wsize = WBUF_INITIAL;
    c->rbuf = malloc(c->rsize);
    c->wbuf = malloc(c->wsize);
    if (c->rbuf == NULL || c->wbuf == NULL || handler->open(c) != 0 || ev_add(loop, fd, EV_READ, c) != 0) {
        handler->close(c);
        free(c->rbuf);
        free(c->wbuf);
        free(c);
        return NULL;
    }
    c->ev_mask = EV_READ;
    c->next = *list;
    if (*list != NULL)
        (*list)->prev = c;
    *list = c;
    KVS_CONN_OPEN(fd, idx);
    if (settings.verbose > 0)
        fprintf(stderr, "<%d new client connection (worker %d)\n", fd, idx);
    return c;
}

void conn_close(conn *c)
{
    handler->close(c);
    ev_del(c->loop, c->fd);
    KVS_CONN_CLOSE(c->fd, c->idx);
    if (settings.verbose > 0)
        fprintf(stderr, "<%d connection closed\n", c->fd);
    close(c->fd);
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        *c->list = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    __atomic_fetch_sub(&curr_conns, 1, __ATOMIC_RELAXED);
    free(c->rbuf);
    free(c->wbuf);
    free(c);
}

char *out_reserve(conn *c, size_t n)
{
    if (c->wsize - c->wlen >= n)
        return c->wbuf + c->wlen;
    if (c->wsent > 0) { /* slide unsent output to the front first */
        memmove(c->wbuf, c->wbuf + c->wsent, c->wlen - c->wsent);
        c->wlen -= c->wsent;
        c->wsent = 0;
        if (c->wsize - c->wlen >= n)
            return c->wbuf + c->wlen;
    }
    size_t size = c->wsize;
    while (size - c->wlen < n)
        size *= 2;
    char *p = realloc(c->wbuf, size);
    if (p == NULL) {
        c->closing = true;
        return NULL;
    }
    c->wbuf = p;
    c->wsize = size;
    return c->wbuf + c->wlen;
}

void out_add(conn *c, const void *p, size_t n)
{
    char *dst = out_reserve(c, n);
    if (dst == NULL)
        return;
    memcpy(dst, p, n);
    c->wlen += n;
}

void out_str(conn *c, const char *s) { out_add(c, s, strlen(s)); }

void out_printf(conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *dst = n < 0 ? NULL : out_reserve(c, (size_t)n + 1);
    if (dst == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(dst, (size_t)n + 1, fmt, ap);
    va_end(ap);
    c->wlen += (size_t)n;
}

/* Reads what the socket has. Returns -1 when the connection must close. */
static int conn_read(conn *c)
{
    if (c->rpos == c->rlen) {
        c->rpos = c->rlen = 0;
        if (c->rsize > RBUF_INITIAL) { /* give back what a long line took */
            char *p = realloc(c->rbuf, RBUF_INITIAL);
            if (p != NULL) {
                c->rbuf = p;
                c->rsize = RBUF_INITIAL;
            }
        }
    } else if (c->rpos > 0 && c->rsize - c->rlen < RBUF_INITIAL / 4) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    if (c->rlen == c->rsize) {
        /* Only input the protocol cannot consume yet gets here (a command
         * line longer than the buffer: values are consumed as they arrive);
         * the protocol refuses it once the buffer is at rbuf_max. */
        size_t size = c->rsize * 2 > handler->rbuf_max ? handler->rbuf_max : c->rsize * 2;
        if (size <= c->rsize)
            return 0;
        char *p = realloc(c->rbuf, size);
        if (p == NULL)
            return -1;
        c->rbuf = p;
        c->rsize = size;
    }
    ssize_t n;
    do {
        n = read(c->fd, c->rbuf + c->rlen, c->rsize - c->rlen);
    } while (n < 0 && errno == EINTR);
    if (n == 0)
        return -1;
    if (n < 0)
        return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    c->rlen += (size_t)n;
    io_add(&io[c->idx].n.bytes_read, (uint64_t)n);
    return 0;
}

/* Writes pending output. Returns -1 when the connection must close. */
static int conn_flush(conn *c)
{
    while (c->wsent < c->wlen) {
        ssize_t n = send(c->fd, c->wbuf + c->wsent, c->wlen - c->wsent, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
        }
        c->wsent += (size_t)n;
        io_add(&io[c->idx].n.bytes_written, (uint64_t)n);
    }
    c->wsent = c->wlen = 0;
    if (c->wsize > WBUF_HIGH_WATER) { /* a big reply is gone: shrink back */
        char *p = realloc(c->wbuf, WBUF_INITIAL);
        if (p != NULL) {
            c->wbuf = p;
            c->wsize = WBUF_INITIAL;
        }
    }
    handler->sent(c);
    return 0;
}

static void set_mask(conn *c, uint32_t mask)
{
    if (c->ev_mask != mask && ev_mod(c->loop, c->fd, mask, c) == 0)
        c->ev_mask = mask;
}

void conn_event(conn *c, uint32_t mask)
{
    if ((mask & EV_READ) && (c->ev_mask & EV_READ) && conn_read(c) < 0) {
        conn_close(c);
        return;
    }
    for (;;) {
        int more = c->closing ? 0 : handler->process(c);
        if (conn_flush(c) < 0) {
            conn_close(c);
            return;
        }
        if (out_pending(c) > 0) {
            set_mask(c, EV_WRITE); /* stop reading until the client catches up */
            return;
        }
        if (c->closing) {
            conn_close(c);
            return;
        }
        if (!more) {
            set_mask(c, EV_READ);
            return;
        }
    }
}
