/* libFuzzer target: bytes from a client, through the real parser and command
 * processing, without sockets.
 *
 * The first byte of an input picks the size of the reads the bytes arrive in
 * (1-256), so lines and values split across reads are exercised as a slow
 * client makes them; the rest is what the client sent. Each input runs on one
 * connection that the harness drives through protocol_handler, as
 * conn_event() does: read, process,
 * flush (the output is dropped), until the input runs out or the connection
 * closes. The item store (4 MB, so eviction happens) is set up once and
 * flushed at the start of each input, so an input sees only what it stored:
 * a fresh store per input costs more than the input (megabytes of slab
 * pages allocated and poisoned by ASan).
 *
 * Built with -fsanitize=fuzzer,address,undefined by `make -C server fuzz`;
 * run by `make fuzz` (seed corpus: server/fuzz/corpus). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/conn.h"
#include "protocol/process.h"
#include "settings.h"
#include "stats/sites.h"
#include "stats/stats.h"
#include "storage/items.h"
#include "trace.h"
#include "util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* defined by main.c in kvcached */
struct settings settings;
int kv_probe_sample = KV_PROBE_SAMPLE_DEFAULT;
int kv_probe_rate = KV_PROBE_RATE_DEFAULT;

#define MEM_LIMIT (4 * 1024 * 1024)
#define ITEM_SIZE_MAX (64 * 1024)

static const struct conn_handler *const h = &protocol_handler;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    enum site_mode modes[SITES_MAX];
    for (int s = 0; s < SITES_MAX; s++)
        modes[s] = MODE_SHARED;
    settings = (struct settings){
        .iface = "127.0.0.1", .port = 11211, .nthreads = 1, .maxbytes = MEM_LIMIT, .maxconns = 16,
        .item_size_max = ITEM_SIZE_MAX, .probe_sample = KV_PROBE_SAMPLE_DEFAULT, .cpu_affinity = "",
    };
    kv_thread_idx = 0;
    if (stats_setup(1) != 0 || sites_setup(1, modes) != 0 || items_setup(MEM_LIMIT, ITEM_SIZE_MAX, KEY_COMPARE_INLINE) != 0)
        abort();
    return 0;
}

/* What conn_read() would have appended: n more bytes at the end of rbuf. */
static void feed(conn *c, const uint8_t *p, size_t n)
{
    if (c->rpos == c->rlen) {
        c->rpos = c->rlen = 0;
    } else if (c->rpos > 0) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    if (c->rsize - c->rlen < n) {
        size_t size = c->rsize;
        while (size - c->rlen < n)
            size *= 2;
        char *bigger = realloc(c->rbuf, size);
        if (bigger == NULL)
            abort();
        c->rbuf = bigger;
        c->rsize = size;
    }
    memcpy(c->rbuf + c->rlen, p, n);
    c->rlen += n;
}

/* conn_event() after a read: process and flush until input runs out.
 * Returns 0 once the connection is closing. */
static int serve(conn *c)
{
    for (;;) {
        int more = c->closing ? 0 : h->process(c);
        c->wsent = c->wlen = 0; /* the client read it all */
        h->sent(c);
        if (c->closing)
            return 0;
        if (!more)
            return 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t chunk = (size_t)data[0] + 1;
    data++;
    size--;
    items_flush(now_ns());
    conn c = {.fd = -1, .idx = 0, .rsize = RBUF_INITIAL, .wsize = WBUF_INITIAL};
    c.rbuf = malloc(c.rsize);
    c.wbuf = malloc(c.wsize);
    if (c.rbuf == NULL || c.wbuf == NULL || h->open(&c) != 0)
        abort();
    for (size_t at = 0; at < size;) {
        size_t n = size - at < chunk ? size - at : chunk;
        feed(&c, data + at, n);
        at += n;
        if (!serve(&c))
            break;
    }
    h->close(&c);
    free(c.rbuf);
    free(c.wbuf);
    return 0;
}
