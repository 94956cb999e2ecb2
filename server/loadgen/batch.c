#include "loadgen/batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen/options.h"
#include "loadgen/workload.h"

static void out_need(struct conn *c, size_t n)
{
    if (c->out_len + n <= c->out_cap)
        return;
    while (c->out_len + n > c->out_cap)
        c->out_cap = c->out_cap ? c->out_cap * 2 : 65536;
    c->out = realloc(c->out, c->out_cap);
    if (c->out == NULL) {
        fprintf(stderr, "kvload: out of memory\n");
        exit(1);
    }
}

static void append_set(struct thread *t, struct conn *c, long k)
{
    char key[KEY_MAX + 1];
    int nkey = key_name(key, k);
    int size = opt.min_size + (int)(rng_next(&t->rng) % (uint64_t)(opt.max_size - opt.min_size + 1));
    out_need(c, (size_t)nkey + (size_t)size + 64);
    c->out_len += (size_t)sprintf(c->out + c->out_len, "set %s 0 0 %d\r\n", key, size);
    make_value(c->out + c->out_len, size, key, nkey, &t->rng);
    c->out_len += (size_t)size;
    memcpy(c->out + c->out_len, "\r\n", 2);
    c->out_len += 2;
}

static void append_get(struct conn *c)
{
    out_need(c, 8 + (size_t)c->ngets * (KEY_MAX + 1));
    memcpy(c->out + c->out_len, "get", 3);
    c->out_len += 3;
    for (int i = 0; i < c->ngets; i++) {
        c->out[c->out_len++] = ' ';
        c->out_len += (size_t)key_name(c->out + c->out_len, c->get_keys[i]);
    }
    memcpy(c->out + c->out_len, "\r\n", 2);
    c->out_len += 2;
}

void build_batch(struct thread *t, struct conn *c)
{
    c->out_len = c->out_sent = 0;
    c->nsets = c->ngets = 0;
    for (int i = 0; i < opt.batch; i++) {
        long k = pick_key(&t->rng);
        if ((int)(rng_next(&t->rng) % 100) < opt.set_pct) {
            append_set(t, c, k);
            c->nsets++;
        } else {
            c->get_keys[c->ngets++] = k;
        }
    }
    if (c->ngets > 0)
        append_get(c);
    c->sets_left = c->nsets;
    c->get_pending = c->ngets > 0;
    c->get_seen = 0;
    c->sent_at = now_ns();
}

void build_populate(struct thread *t, struct conn *c, long *next)
{
    c->out_len = c->out_sent = 0;
    c->nsets = c->ngets = 0;
    while (c->nsets < opt.batch && *next < t->populate_to) {
        append_set(t, c, (*next)++);
        c->nsets++;
    }
    c->sets_left = c->nsets;
    c->get_pending = false;
    c->sent_at = now_ns();
}

/* What one reply line (or a VALUE with its data) did to the batch. */
struct reply {
    struct thread *t;
    struct conn *c;
    bool measure;
    uint64_t latency; /* ns since the batch was sent */
};

static void answered(const struct reply *r, int n)
{
    if (!r->measure)
        return;
    r->t->n.ops += (uint64_t)n;
    for (int i = 0; i < n; i++)
        hist_add(&r->t->hist, r->latency);
}

static void on_stored(const struct reply *r, const char *line, size_t llen)
{
    struct thread *t = r->t;
    if (llen != 8 || memcmp(line, "STORED\r\n", 8) != 0) {
        t->n.errors++;
        if (!opt.quiet && t->n.errors <= 3)
            fprintf(stderr, "kvload: set failed: %.*s\n", (int)(llen - 2 > 200 ? 200 : llen - 2), line);
    }
    if (r->measure)
        t->n.sets++;
    answered(r, 1);
    r->c->sets_left--;
}

static void on_end(const struct reply *r)
{
    /* the gets not answered by a VALUE were misses */
    int missed = r->c->ngets - r->c->get_seen;
    r->t->n.gets += (uint64_t)missed;
    r->t->n.misses += (uint64_t)missed;
    answered(r, missed);
    r->c->get_pending = false;
}

/* A VALUE line of llen bytes with `avail` bytes from its start arrived: the
 * bytes it and its data take, 0 when the data has not all arrived, -1 when
 * the line is malformed. */
static long on_value(const struct reply *r, char *line, size_t llen, size_t avail)
{
    struct thread *t = r->t;
    char *key = line + 6, *sp = memchr(key, ' ', llen - 6);
    if (sp == NULL)
        return -1;
    size_t nkey = (size_t)(sp - key);
    unsigned long flags;
    long bytes;
    if (sscanf(sp, " %lu %ld", &flags, &bytes) != 2 || bytes < 0)
        return -1;
    if (avail < llen + (size_t)bytes + 2)
        return 0; /* the value has not fully arrived */
    const char *val = line + llen;
    if (opt.verify && !check_value(val, (size_t)bytes, key, nkey)) {
        t->n.mismatches++;
        if (!opt.quiet && t->n.mismatches <= 3)
            fprintf(stderr, "kvload: verify mismatch for key %.*s (%ld bytes)\n", (int)nkey, key, bytes);
    }
    t->n.gets++;
    t->n.hits++;
    answered(r, 1);
    r->c->get_seen++;
    return (long)(llen + (size_t)bytes + 2);
}

int parse_replies(struct thread *t, struct conn *c, bool measure)
{
    struct reply r = {.t = t, .c = c, .measure = measure, .latency = now_ns() - c->sent_at};
    size_t pos = 0;
    int result = 0;
    for (;;) {
        if (c->sets_left == 0 && !c->get_pending) {
            result = 1;
            break;
        }
        char *line = c->in + pos;
        char *nl = memchr(line, '\n', c->in_len - pos);
        if (nl == NULL)
            break;
        size_t llen = (size_t)(nl - line) + 1;
        if (c->sets_left > 0) {
            on_stored(&r, line, llen);
            pos += llen;
        } else if (llen == 5 && memcmp(line, "END\r\n", 5) == 0) {
            on_end(&r);
            pos += llen;
        } else if (llen > 6 && memcmp(line, "VALUE ", 6) == 0) {
            long used = on_value(&r, line, llen, c->in_len - pos);
            if (used < 0)
                return -1;
            if (used == 0)
                break;
            pos += (size_t)used;
        } else {
            t->n.errors++;
            if (!opt.quiet && t->n.errors <= 3)
                fprintf(stderr, "kvload: unexpected reply: %.*s\n", (int)(llen > 200 ? 200 : llen), line);
            return -1;
        }
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
    return result;
}
