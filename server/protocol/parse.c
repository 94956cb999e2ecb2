#include "protocol/parse.h"

#include <string.h>

#include "storage/item.h"

#define MAX_TOKENS 8

#define ERR_FORMAT "CLIENT_ERROR bad command line format\r\n"
#define ERR_UNKNOWN "ERROR\r\n"
#define ERR_SITE_USAGE "CLIENT_ERROR usage: site <function|all> <shared|per-thread>\r\n"

struct token {
    const char *s;
    size_t n;
};

static const struct {
    const char *name;
    size_t len;
} commands[CMD_MAX] = {
#define X(id, name) [CMD_##id] = {name, sizeof(name) - 1},
    KV_COMMANDS(X)
#undef X
};

static bool parse_u64(struct token t, uint64_t *out)
{
    uint64_t v = 0;
    if (t.n == 0 || t.n > 20)
        return false;
    for (size_t i = 0; i < t.n; i++) {
        if (t.s[i] < '0' || t.s[i] > '9')
            return false;
        unsigned d = (unsigned)(t.s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static bool parse_u32(struct token t, uint32_t *out)
{
    uint64_t v;
    if (!parse_u64(t, &v) || v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

static bool parse_i64(struct token t, int64_t *out)
{
    uint64_t v;
    bool neg = t.n > 0 && t.s[0] == '-';
    struct token digits = {t.s + neg, t.n - neg};
    if (!parse_u64(digits, &v) || v > (uint64_t)INT64_MAX)
        return false;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return true;
}

static bool is_noreply(struct token t) { return t.n == 7 && memcmp(t.s, "noreply", 7) == 0; }

/* Splits on runs of spaces, as memcached does; returns the token count, or
 * MAX_TOKENS + 1 when there are more. */
static size_t tokenize(const char *s, size_t n, struct token *tok)
{
    size_t count = 0, i = 0;
    while (i < n) {
        while (i < n && s[i] == ' ')
            i++;
        if (i == n)
            break;
        size_t start = i;
        while (i < n && s[i] != ' ')
            i++;
        if (count == MAX_TOKENS)
            return MAX_TOKENS + 1;
        tok[count].s = s + start;
        tok[count].n = i - start;
        count++;
    }
    return count;
}

static enum parse_status invalid(struct request *req, const char *error)
{
    req->error = error;
    return PARSE_EINVALID;
}

/* A command line split into tokens (ntok is MAX_TOKENS + 1 when there were
 * more than tok holds), and the line itself without its end. */
struct line {
    struct token tok[MAX_TOKENS];
    size_t ntok;
    const char *s;
    size_t n;
};

/* get, gets, gat, gats */
static enum parse_status parse_get(struct request *req, const struct line *l)
{
    /* The key list is not tokenized here: it may hold thousands of keys,
     * which the processor walks with parse_next_key(). */
    size_t first = 1;
    if (req->cmd == CMD_GAT || req->cmd == CMD_GATS) {
        if (l->ntok < 3)
            return invalid(req, ERR_UNKNOWN);
        if (!parse_i64(l->tok[1], &req->exptime))
            return invalid(req, "CLIENT_ERROR invalid exptime argument\r\n");
        first = 2;
    } else if (l->ntok < 2) {
        return invalid(req, ERR_UNKNOWN);
    }
    req->keys = l->tok[first].s;
    req->nkeys_len = (size_t)(l->s + l->n - l->tok[first].s);
    return PARSE_OK;
}

/* set, add, replace, append, prepend, cas */
static enum parse_status parse_storage(struct request *req, const struct line *l)
{
    const struct token *tok = l->tok;
    size_t ntok = l->ntok;
    bool cas = req->cmd == CMD_CAS;
    size_t base = cas ? 6 : 5;
    uint64_t vlen;
    if (ntok > MAX_TOKENS)
        return invalid(req, ERR_UNKNOWN);
    if (ntok != base && !(ntok == base + 1 && is_noreply(tok[base])))
        return invalid(req, ERR_UNKNOWN);
    if (tok[1].n > KEY_MAX_LENGTH)
        return invalid(req, ERR_FORMAT);
    if (!parse_u32(tok[2], &req->flags) || !parse_i64(tok[3], &req->exptime) || !parse_u64(tok[4], &vlen) ||
        vlen > (uint64_t)INT32_MAX - 2 || (cas && !parse_u64(tok[5], &req->cas)))
        return invalid(req, ERR_FORMAT);
    req->key = tok[1].s;
    req->nkey = tok[1].n;
    req->vlen = vlen;
    req->noreply = ntok == base + 1;
    return PARSE_OK;
}

static enum parse_status parse_delete(struct request *req, const struct line *l)
{
    const struct token *tok = l->tok;
    size_t ntok = l->ntok;
    if (ntok < 2 || ntok > 4)
        return invalid(req, ERR_UNKNOWN);
    if (tok[1].n > KEY_MAX_LENGTH)
        return invalid(req, ERR_FORMAT);
    req->key = tok[1].s;
    req->nkey = tok[1].n;
    req->noreply = is_noreply(tok[ntok - 1]);
    /* "delete <key> 0" is accepted for old clients; any other time is not */
    if (ntok - 2 - req->noreply > 1 || (ntok - 2 - req->noreply == 1 && !(tok[2].n == 1 && tok[2].s[0] == '0')))
        return invalid(req, "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n");
    return PARSE_OK;
}

/* "<command> <key> <argument> [noreply]" (incr, decr, touch): the token
 * count, the key and noreply; the caller parses the argument, tok[2]. */
static enum parse_status parse_key_arg(struct request *req, const struct line *l)
{
    if (l->ntok != 3 && !(l->ntok == 4 && is_noreply(l->tok[3])))
        return invalid(req, ERR_UNKNOWN);
    if (l->tok[1].n > KEY_MAX_LENGTH)
        return invalid(req, ERR_FORMAT);
    req->key = l->tok[1].s;
    req->nkey = l->tok[1].n;
    req->noreply = l->ntok == 4;
    return PARSE_OK;
}

/* incr, decr */
static enum parse_status parse_arith(struct request *req, const struct line *l)
{
    if (parse_key_arg(req, l) != PARSE_OK)
        return PARSE_EINVALID;
    if (!parse_u64(l->tok[2], &req->delta))
        return invalid(req, "CLIENT_ERROR invalid numeric delta argument\r\n");
    return PARSE_OK;
}

static enum parse_status parse_touch(struct request *req, const struct line *l)
{
    if (parse_key_arg(req, l) != PARSE_OK)
        return PARSE_EINVALID;
    if (!parse_i64(l->tok[2], &req->exptime))
        return invalid(req, "CLIENT_ERROR invalid exptime argument\r\n");
    return PARSE_OK;
}

static enum parse_status parse_flush_all(struct request *req, const struct line *l)
{
    size_t ntok = l->ntok;
    if (ntok > 3)
        return invalid(req, ERR_UNKNOWN);
    req->noreply = ntok > 1 && is_noreply(l->tok[ntok - 1]);
    req->exptime = 0;
    if (ntok - req->noreply == 2 && !parse_i64(l->tok[1], &req->exptime))
        return invalid(req, ERR_FORMAT);
    if (ntok == 3 && !req->noreply)
        return invalid(req, ERR_UNKNOWN);
    return PARSE_OK;
}

static enum parse_status parse_verbosity(struct request *req, const struct line *l)
{
    /* as memcached: one or two arguments, a trailing noreply honoured */
    if (l->ntok < 2 || l->ntok > 3)
        return invalid(req, ERR_UNKNOWN);
    req->noreply = is_noreply(l->tok[l->ntok - 1]);
    return PARSE_OK;
}

/* version, quit: memcached ignores anything after these */
static enum parse_status parse_bare(struct request *req, const struct line *l)
{
    (void)req;
    (void)l;
    return PARSE_OK;
}

static enum parse_status parse_stats(struct request *req, const struct line *l)
{
    if (l->ntok > 2)
        return invalid(req, ERR_UNKNOWN);
    req->arg = l->ntok == 2 ? l->tok[1].s : NULL;
    req->narg = l->ntok == 2 ? l->tok[1].n : 0;
    return PARSE_OK;
}

/* site <function|all> <shared|per-thread>: kvcached's own; the handler knows the names */
static enum parse_status parse_site(struct request *req, const struct line *l)
{
    if (l->ntok != 3)
        return invalid(req, ERR_SITE_USAGE);
    req->arg = l->tok[1].s;
    req->narg = l->tok[1].n;
    req->arg2 = l->tok[2].s;
    req->narg2 = l->tok[2].n;
    return PARSE_OK;
}

static enum parse_status (*const parsers[CMD_MAX])(struct request *, const struct line *) = {
    [CMD_GET] = parse_get,         [CMD_GETS] = parse_get,         [CMD_GAT] = parse_get,
    [CMD_GATS] = parse_get,        [CMD_SET] = parse_storage,      [CMD_ADD] = parse_storage,
    [CMD_REPLACE] = parse_storage, [CMD_APPEND] = parse_storage,   [CMD_PREPEND] = parse_storage,
    [CMD_CAS] = parse_storage,     [CMD_DELETE] = parse_delete,    [CMD_INCR] = parse_arith,
    [CMD_DECR] = parse_arith,      [CMD_TOUCH] = parse_touch,      [CMD_FLUSH_ALL] = parse_flush_all,
    [CMD_VERSION] = parse_bare,    [CMD_VERBOSITY] = parse_verbosity, [CMD_QUIT] = parse_bare,
    [CMD_STATS] = parse_stats,     [CMD_SITE] = parse_site,
};

static enum parse_status parse_tokens(struct request *req, const char *s, size_t n)
{
    struct line l = {.s = s, .n = n};
    l.ntok = tokenize(s, n, l.tok);
    if (l.ntok == 0)
        return invalid(req, ERR_UNKNOWN);
    int cmd = -1;
    for (int i = 0; i < CMD_MAX; i++)
        if (l.tok[0].n == commands[i].len && memcmp(l.tok[0].s, commands[i].name, l.tok[0].n) == 0)
            cmd = i;
    if (cmd < 0 || parsers[cmd] == NULL)
        return invalid(req, ERR_UNKNOWN);
    req->cmd = (enum command)cmd;
    return parsers[cmd](req, &l);
}

enum parse_status parse_request(const char *buf, size_t len, struct request *req)
{
    memset(req, 0, sizeof(*req));
    size_t scan = len < KV_LINE_MAX ? len : KV_LINE_MAX;
    const char *nl = memchr(buf, '\n', scan);
    if (nl == NULL)
        return len >= KV_LINE_MAX ? PARSE_EOVERSIZE : PARSE_EUNFIN;
    req->line_len = (size_t)(nl - buf) + 1;
    size_t n = (size_t)(nl - buf);
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    return parse_tokens(req, buf, n);
}

size_t parse_next_key(const char *keys, size_t len, size_t *pos, const char **key)
{
    size_t i = *pos;
    while (i < len && keys[i] == ' ')
        i++;
    size_t start = i;
    while (i < len && keys[i] != ' ')
        i++;
    *pos = i;
    *key = keys + start;
    return i - start;
}
