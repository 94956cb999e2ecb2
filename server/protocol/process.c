#include "protocol/process.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "opcodes.h"
#include "protocol/parse.h"
#include "protocol/stats_out.h"
#include "settings.h"
#include "stats/sites.h"
#include "stats/stats.h"
#include "storage/items.h"
#include "trace.h"
#include "util.h"

#define MONTH_S 2592000 /* exptimes above 30 days are absolute Unix times */

/* The protocol's half of a connection (conn.data): the command in progress. */
struct proto_conn {
    enum {
        REQ_PARSE,   /* expecting a command line */
        REQ_NREAD,   /* reading a storage command's value into item */
        REQ_SWALLOW, /* discarding the value of a refused storage command */
    } state;

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
};

/* cmd__* sampling: one sampler per worker, one decision per request; the
 * weight of the request being executed, 0 when it is not sampled. */
static __thread struct kv_sampler cmd_sampler;
static __thread uint32_t cmd_weight;

static inline void op_begin(conn *c, enum opcode op, const char *key, size_t nkey, uint64_t t0)
{
    struct proto_conn *pc = c->data;
    pc->op_start = t0;
    cmd_weight = 0;
    if (unlikely(KVS_CMD_START_ENABLED() || KVS_CMD_DONE_ENABLED()) && (cmd_weight = sample_tick(&cmd_sampler))) {
        /* The worker index from the connection, not the TLS variable: gcc
         * would describe that argument as %fs:(...), which BCC cannot read. */
        KVS_CMD_START(c->idx, (int)op, (char *)key, (int)nkey);
    }
}

/* Ends the request: its latency goes to collect_timings. Returns the time it
 * ended, which a multi-get uses as the start of its next key. */
static inline uint64_t op_end(conn *c, enum opcode op, enum op_status status)
{
    struct proto_conn *pc = c->data;
    uint64_t t1 = now_ns();
    uint64_t latency = t1 - pc->op_start;
    collect_timings(op, latency);
    if (unlikely(cmd_weight)) {
        int weight = (int)cmd_weight; /* in a register, as BCC reads USDT arguments */
        __asm__ volatile("" : "+r"(weight));
        KVS_CMD_DONE(c->idx, (int)op, (int)status, latency, weight);
    }
    return t1;
}

static void reply(conn *c, bool noreply, const char *s)
{
    if (!noreply)
        out_str(c, s);
}

static uint64_t exp_to_ns(int64_t exptime, uint64_t now)
{
    if (exptime == 0)
        return 0;
    if (exptime < 0)
        return 1; /* already expired */
    if (exptime > MONTH_S) {
        int64_t wall = (int64_t)time(NULL);
        if (exptime <= wall)
            return 1;
        exptime -= wall;
    }
    return now + ns_from_s((uint64_t)exptime);
}

static char *u64_to_dec(char *p, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0)
        *p++ = tmp[--n];
    return p;
}

/* ---- get, gets, gat, gats ---------------------------------------------- */

struct copy_ctx {
    conn *c;
    int with_cas;
    uint32_t size; /* item_size() of the item copied, 0 if none */
};

/* Runs under the item's stripe lock: copy the reply, nothing else. */
static void copy_value(void *arg, const item *it)
{
    struct copy_ctx *x = arg;
    conn *c = x->c;
    char *p = out_reserve(c, 64 + it->nkey + it->nbytes + 2);
    if (p == NULL)
        return;
    char *start = p;
    memcpy(p, "VALUE ", 6);
    p += 6;
    memcpy(p, item_ckey(it), it->nkey);
    p += it->nkey;
    *p++ = ' ';
    p = u64_to_dec(p, it->flags);
    *p++ = ' ';
    p = u64_to_dec(p, it->nbytes);
    if (x->with_cas) {
        *p++ = ' ';
        p = u64_to_dec(p, it->cas);
    }
    *p++ = '\r';
    *p++ = '\n';
    memcpy(p, item_cvalue(it), it->nbytes + 2);
    p += it->nbytes + 2;
    c->wlen += (size_t)(p - start);
    x->size = item_size(it);
}

/* Walks the key list of the get in progress. Returns 1 when it paused
 * because output is over the high water mark. */
static int process_get_keys(conn *c)
{
    struct proto_conn *pc = c->data;
    enum opcode op = pc->get_op;
    int touch = op == OP_GAT || op == OP_GATS;
    uint64_t t = now_ns();
    for (;;) {
        if (out_pending(c) >= WBUF_HIGH_WATER)
            return 1;
        if (c->closing)
            return 0;
        const char *key;
        size_t nkey = parse_next_key(pc->get_keys, pc->get_len, &pc->get_pos, &key);
        if (nkey == 0)
            break;
        if (nkey > KEY_MAX_LENGTH) {
            out_str(c, "CLIENT_ERROR bad command line format\r\n");
            goto done;
        }
        uint64_t hv = kv_hash(key, nkey);
        struct copy_ctx x = {c, op == OP_GETS || op == OP_GATS, 0};
        op_begin(c, op, key, nkey, t);
        enum lookup_result r = items_get(key, (uint8_t)nkey, hv, t, touch ? &pc->gat_exp : NULL, copy_value, &x);
        STAT_INCR(cmd_get);
        if (touch)
            STAT_INCR(cmd_touch);
        if (r == LOOKUP_HIT) {
            STAT_INCR(get_hits);
            if (touch)
                STAT_INCR(touch_hits);
            /* the copy is an item object of its own until the reply is sent */
            on_create_item();
            account_memory((int64_t)x.size);
            pc->copies++;
            pc->copy_bytes += x.size;
        } else {
            STAT_INCR(get_misses);
            if (touch)
                STAT_INCR(touch_misses);
            if (r == LOOKUP_EXPIRED)
                STAT_INCR(get_expired);
            else if (r == LOOKUP_FLUSHED)
                STAT_INCR(get_flushed);
        }
        update_topkeys(key, nkey, hv);
        t = op_end(c, op, r == LOOKUP_HIT ? OPS_OK : OPS_MISS);
    }
    out_str(c, "END\r\n");
done:
    pc->get_active = false;
    c->rpos += pc->get_line_len;
    return 0;
}

/* The replies in wbuf have been written: release their item objects. */
static void process_release_copies(conn *c)
{
    struct proto_conn *pc = c->data;
    for (; pc->copies > 0; pc->copies--)
        on_delete_item();
    if (pc->copy_bytes != 0) {
        account_memory(-pc->copy_bytes);
        pc->copy_bytes = 0;
    }
}

static void start_get(conn *c, struct request *req, enum opcode op)
{
    struct proto_conn *pc = c->data;
    pc->get_active = true;
    pc->get_op = op;
    pc->get_keys = req->keys;
    pc->get_len = req->nkeys_len;
    pc->get_pos = 0;
    pc->get_line_len = req->line_len;
    if (op == OP_GAT || op == OP_GATS)
        pc->gat_exp = exp_to_ns(req->exptime, now_ns());
}

/* ---- storage commands ---------------------------------------------------- */

static const enum opcode store_opcodes[] = {
    [STORE_SET] = OP_SET,         [STORE_ADD] = OP_ADD,         [STORE_REPLACE] = OP_REPLACE,
    [STORE_APPEND] = OP_APPEND,   [STORE_PREPEND] = OP_PREPEND, [STORE_CAS] = OP_CAS,
};

static void refuse_value(conn *c, struct request *req, enum store_op sop, const char *error)
{
    struct proto_conn *pc = c->data;
    reply(c, req->noreply, error);
    /* As memcached: a failed set must not leave the old value readable. */
    if (sop == STORE_SET)
        items_delete(req->key, (uint8_t)req->nkey, pc->hv, pc->op_start);
    pc->swallow_left = req->vlen + 2;
    pc->state = REQ_SWALLOW;
    STAT_INCR(cmd_set);
    op_end(c, store_opcodes[sop], OPS_ERROR);
}

static void process_update(conn *c, struct request *req, enum store_op sop)
{
    struct proto_conn *pc = c->data;
    enum opcode op = store_opcodes[sop];
    op_begin(c, op, req->key, req->nkey, now_ns());
    pc->hv = kv_hash(req->key, req->nkey);
    update_topkeys(req->key, req->nkey, pc->hv);
    if (req->vlen > settings.item_size_max) {
        refuse_value(c, req, sop, "SERVER_ERROR object too large for cache\r\n");
        return;
    }
    item *it = items_alloc(req->key, (uint8_t)req->nkey, req->flags, exp_to_ns(req->exptime, pc->op_start),
                           (uint32_t)req->vlen);
    if (it == NULL) {
        refuse_value(c, req, sop, "SERVER_ERROR out of memory storing object\r\n");
        return;
    }
    pc->item = it;
    pc->nread_left = req->vlen + 2;
    pc->store_op = sop;
    pc->op = op;
    pc->cas_in = req->cas;
    pc->noreply = req->noreply;
    pc->state = REQ_NREAD;
}

static void complete_nread(conn *c)
{
    struct proto_conn *pc = c->data;
    item *it = pc->item;
    pc->item = NULL;
    pc->state = REQ_PARSE;
    STAT_INCR(cmd_set);
    if (memcmp(item_value(it) + it->nbytes, "\r\n", 2) != 0) {
        items_abandon(it);
        reply(c, pc->noreply, "CLIENT_ERROR bad data chunk\r\n");
        op_end(c, pc->op, OPS_ERROR);
        return;
    }
    enum store_op sop = pc->store_op;
    enum store_result r = items_store(it, sop, pc->cas_in, pc->hv, now_ns());
    enum op_status status = OPS_OK;
    switch (r) {
    case STORE_STORED:
        STAT_INCR(total_items);
        if (sop == STORE_CAS)
            STAT_INCR(cas_hits);
        reply(c, pc->noreply, "STORED\r\n");
        break;
    case STORE_NOT_STORED:
        status = OPS_NOT_STORED;
        reply(c, pc->noreply, "NOT_STORED\r\n");
        break;
    case STORE_EXISTS:
        status = OPS_EXISTS;
        STAT_INCR(cas_badval);
        reply(c, pc->noreply, "EXISTS\r\n");
        break;
    case STORE_NOT_FOUND:
        status = OPS_MISS;
        STAT_INCR(cas_misses);
        reply(c, pc->noreply, "NOT_FOUND\r\n");
        break;
    case STORE_NO_MEMORY:
        status = OPS_ERROR;
        reply(c, pc->noreply, "SERVER_ERROR out of memory storing object\r\n");
        break;
    }
    op_end(c, pc->op, status);
}

static void process_set(conn *c, struct request *req) { process_update(c, req, STORE_SET); }
static void process_add(conn *c, struct request *req) { process_update(c, req, STORE_ADD); }
static void process_replace(conn *c, struct request *req) { process_update(c, req, STORE_REPLACE); }
static void process_append(conn *c, struct request *req) { process_update(c, req, STORE_APPEND); }
static void process_prepend(conn *c, struct request *req) { process_update(c, req, STORE_PREPEND); }
static void process_cas(conn *c, struct request *req) { process_update(c, req, STORE_CAS); }

/* ---- other keyed commands -------------------------------------------------- */

static void process_get(conn *c, struct request *req) { start_get(c, req, OP_GET); }
static void process_gets(conn *c, struct request *req) { start_get(c, req, OP_GETS); }
static void process_gat(conn *c, struct request *req) { start_get(c, req, OP_GAT); }
static void process_gats(conn *c, struct request *req) { start_get(c, req, OP_GATS); }

static void process_delete(conn *c, struct request *req)
{
    struct proto_conn *pc = c->data;
    uint64_t hv = kv_hash(req->key, req->nkey);
    op_begin(c, OP_DELETE, req->key, req->nkey, now_ns());
    int found = items_delete(req->key, (uint8_t)req->nkey, hv, pc->op_start);
    if (found)
        STAT_INCR(delete_hits);
    else
        STAT_INCR(delete_misses);
    update_topkeys(req->key, req->nkey, hv);
    reply(c, req->noreply, found ? "DELETED\r\n" : "NOT_FOUND\r\n");
    op_end(c, OP_DELETE, found ? OPS_OK : OPS_MISS);
}

static void process_arith(conn *c, struct request *req, int incr)
{
    struct proto_conn *pc = c->data;
    enum opcode op = incr ? OP_INCR : OP_DECR;
    uint64_t hv = kv_hash(req->key, req->nkey), value = 0;
    op_begin(c, op, req->key, req->nkey, now_ns());
    enum arith_result r = items_arith(req->key, (uint8_t)req->nkey, hv, incr, req->delta, pc->op_start, &value);
    update_topkeys(req->key, req->nkey, hv);
    enum op_status status = OPS_OK;
    switch (r) {
    case ARITH_OK: {
        if (incr)
            STAT_INCR(incr_hits);
        else
            STAT_INCR(decr_hits);
        if (!req->noreply) {
            char buf[24], *end = u64_to_dec(buf, value);
            memcpy(end, "\r\n", 2);
            out_add(c, buf, (size_t)(end - buf) + 2);
        }
        break;
    }
    case ARITH_NOT_FOUND:
        status = OPS_MISS;
        if (incr)
            STAT_INCR(incr_misses);
        else
            STAT_INCR(decr_misses);
        reply(c, req->noreply, "NOT_FOUND\r\n");
        break;
    case ARITH_NON_NUMERIC:
        status = OPS_ERROR;
        reply(c, req->noreply, "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
        break;
    case ARITH_NO_MEMORY:
        status = OPS_ERROR;
        reply(c, req->noreply, "SERVER_ERROR out of memory\r\n");
        break;
    }
    op_end(c, op, status);
}

static void process_incr(conn *c, struct request *req) { process_arith(c, req, 1); }
static void process_decr(conn *c, struct request *req) { process_arith(c, req, 0); }

static void process_touch(conn *c, struct request *req)
{
    struct proto_conn *pc = c->data;
    uint64_t hv = kv_hash(req->key, req->nkey);
    op_begin(c, OP_TOUCH, req->key, req->nkey, now_ns());
    int found = items_touch(req->key, (uint8_t)req->nkey, hv, exp_to_ns(req->exptime, pc->op_start), pc->op_start);
    STAT_INCR(cmd_touch);
    if (found)
        STAT_INCR(touch_hits);
    else
        STAT_INCR(touch_misses);
    update_topkeys(req->key, req->nkey, hv);
    reply(c, req->noreply, found ? "TOUCHED\r\n" : "NOT_FOUND\r\n");
    op_end(c, OP_TOUCH, found ? OPS_OK : OPS_MISS);
}

/* ---- the rest ---------------------------------------------------------------- */

static void process_flush_all(conn *c, struct request *req)
{
    struct proto_conn *pc = c->data;
    op_begin(c, OP_FLUSH_ALL, NULL, 0, now_ns());
    items_flush(req->exptime > 0 ? exp_to_ns(req->exptime, pc->op_start) : pc->op_start);
    STAT_INCR(cmd_flush);
    reply(c, req->noreply, "OK\r\n");
    op_end(c, OP_FLUSH_ALL, OPS_OK);
}

static void process_version(conn *c, struct request *req)
{
    (void)req;
    out_str(c, "VERSION " KV_PROTOCOL_VERSION "\r\n");
}

/* Accepted for compatibility; logging stays as -v set it, so a client
 * cannot turn a loaded server's stderr into a bottleneck. */
static void process_verbosity(conn *c, struct request *req) { reply(c, req->noreply, "OK\r\n"); }

static void process_quit(conn *c, struct request *req)
{
    (void)req;
    c->closing = true;
}

static void process_stats_cmd(conn *c, struct request *req) { process_stats(c, req->arg, req->narg); }

static void process_site(conn *c, struct request *req)
{
    int r = sites_switch(req->arg, req->narg, req->arg2, req->narg2);
#define X(id, fn, flag) fn " (" flag "), "
    out_str(c, r == 0    ? "OK\r\n"
               : r == -1 ? "CLIENT_ERROR unknown site: " KV_SITES(X) "on_delete_item or all\r\n"
                         : "CLIENT_ERROR mode must be shared or per-thread\r\n");
#undef X
}

static void (*const handlers[CMD_MAX])(conn *, struct request *) = {
    [CMD_GET] = process_get,         [CMD_GETS] = process_gets,
    [CMD_GAT] = process_gat,         [CMD_GATS] = process_gats,
    [CMD_SET] = process_set,         [CMD_ADD] = process_add,
    [CMD_REPLACE] = process_replace, [CMD_APPEND] = process_append,
    [CMD_PREPEND] = process_prepend, [CMD_CAS] = process_cas,
    [CMD_DELETE] = process_delete,   [CMD_INCR] = process_incr,
    [CMD_DECR] = process_decr,       [CMD_TOUCH] = process_touch,
    [CMD_FLUSH_ALL] = process_flush_all, [CMD_VERSION] = process_version,
    [CMD_VERBOSITY] = process_verbosity, [CMD_QUIT] = process_quit,
    [CMD_STATS] = process_stats_cmd, [CMD_SITE] = process_site,
};

/* Runs commands from rbuf until input runs out, output passes the high water
 * mark (returns 1: call again once it drained), or the connection closes. */
static int process_commands(conn *c)
{
    struct proto_conn *pc = c->data;
    for (;;) {
        if (c->closing)
            return 0;
        if (pc->get_active) {
            if (process_get_keys(c))
                return 1;
            continue;
        }
        if (out_pending(c) >= WBUF_HIGH_WATER)
            return 1;
        size_t avail = c->rlen - c->rpos;
        if (avail == 0)
            return 0;
        switch (pc->state) {
        case REQ_NREAD: {
            size_t n = avail < pc->nread_left ? avail : (size_t)pc->nread_left;
            memcpy(item_value(pc->item) + (pc->item->nbytes + 2 - pc->nread_left), c->rbuf + c->rpos, n);
            c->rpos += n;
            pc->nread_left -= n;
            if (pc->nread_left == 0)
                complete_nread(c);
            break;
        }
        case REQ_SWALLOW: {
            size_t n = avail < pc->swallow_left ? avail : (size_t)pc->swallow_left;
            c->rpos += n;
            pc->swallow_left -= n;
            if (pc->swallow_left == 0)
                pc->state = REQ_PARSE;
            break;
        }
        case REQ_PARSE: {
            struct request req;
            switch (parse_request(c->rbuf + c->rpos, avail, &req)) {
            case PARSE_EUNFIN:
                return 0;
            case PARSE_EOVERSIZE:
                out_str(c, "CLIENT_ERROR line too long\r\n");
                c->closing = true;
                return 0;
            case PARSE_EINVALID:
                c->rpos += req.line_len;
                out_str(c, req.error);
                break;
            case PARSE_OK:
                if (req.keys == NULL) /* a get consumes its line when done */
                    c->rpos += req.line_len;
                handlers[req.cmd](c, &req);
                break;
            }
            break;
        }
        }
    }
}

static int process_open(conn *c)
{
    c->data = calloc(1, sizeof(struct proto_conn));
    return c->data == NULL ? -1 : 0;
}

/* The connection is going away: drop a half-read item and any copies. */
static void process_close(conn *c)
{
    struct proto_conn *pc = c->data;
    if (pc == NULL)
        return;
    if (pc->item != NULL)
        items_abandon(pc->item);
    process_release_copies(c);
    free(pc);
    c->data = NULL;
}

const struct conn_handler protocol_handler = {
    .rbuf_max = KV_LINE_MAX + 1, /* room to see that a line has no newline within the limit */
    .open = process_open,
    .process = process_commands,
    .sent = process_release_copies,
    .close = process_close,
};
