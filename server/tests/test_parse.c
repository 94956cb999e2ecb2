/* Unit tests of the pure parser: one table row per behaviour, and a round
 * trip per command (the fields composed into a line, parsed back), run by
 * `make -C server check`. */
#include <stdio.h>
#include <string.h>

#include "protocol/parse.h"
#include "tests/check.h"

static enum parse_status parse(const char *line, struct request *req)
{
    return parse_request(line, strlen(line), req);
}

static void test_commands(void)
{
    static const struct {
        const char *line;
        enum parse_status status;
        enum command cmd;
        int noreply;
    } rows[] = {
        {"get a\r\n", PARSE_OK, CMD_GET, 0},
        {"gets a b c\r\n", PARSE_OK, CMD_GETS, 0},
        {"gat 10 a b\r\n", PARSE_OK, CMD_GAT, 0},
        {"gats 10 a\r\n", PARSE_OK, CMD_GATS, 0},
        {"set k 1 2 3\r\n", PARSE_OK, CMD_SET, 0},
        {"set k 1 2 3 noreply\r\n", PARSE_OK, CMD_SET, 1},
        {"add k 0 0 1\n", PARSE_OK, CMD_ADD, 0},
        {"replace k 0 0 1\r\n", PARSE_OK, CMD_REPLACE, 0},
        {"append k 0 0 1\r\n", PARSE_OK, CMD_APPEND, 0},
        {"prepend k 0 0 1 noreply\r\n", PARSE_OK, CMD_PREPEND, 1},
        {"cas k 0 0 1 99\r\n", PARSE_OK, CMD_CAS, 0},
        {"cas k 0 0 1 99 noreply\r\n", PARSE_OK, CMD_CAS, 1},
        {"delete k\r\n", PARSE_OK, CMD_DELETE, 0},
        {"delete k 0\r\n", PARSE_OK, CMD_DELETE, 0},
        {"delete k noreply\r\n", PARSE_OK, CMD_DELETE, 1},
        {"incr k 5\r\n", PARSE_OK, CMD_INCR, 0},
        {"decr k 5 noreply\r\n", PARSE_OK, CMD_DECR, 1},
        {"touch k 10\r\n", PARSE_OK, CMD_TOUCH, 0},
        {"flush_all\r\n", PARSE_OK, CMD_FLUSH_ALL, 0},
        {"flush_all 10\r\n", PARSE_OK, CMD_FLUSH_ALL, 0},
        {"flush_all noreply\r\n", PARSE_OK, CMD_FLUSH_ALL, 1},
        {"flush_all 10 noreply\r\n", PARSE_OK, CMD_FLUSH_ALL, 1},
        {"version\r\n", PARSE_OK, CMD_VERSION, 0},
        {"verbosity 1\r\n", PARSE_OK, CMD_VERBOSITY, 0},
        {"quit\r\n", PARSE_OK, CMD_QUIT, 0},
        {"stats\r\n", PARSE_OK, CMD_STATS, 0},
        {"stats settings\r\n", PARSE_OK, CMD_STATS, 0},
        {"site all shared\r\n", PARSE_OK, CMD_SITE, 0},
        {"site all\r\n", PARSE_EINVALID, CMD_SITE, 0},
        {"site a b c\r\n", PARSE_EINVALID, CMD_SITE, 0},
        {"get\r\n", PARSE_EINVALID, CMD_GET, 0},
        {"bogus\r\n", PARSE_EINVALID, CMD_MAX, 0},
        {"\r\n", PARSE_EINVALID, CMD_MAX, 0},
        {"set k 0 0 -1\r\n", PARSE_EINVALID, CMD_SET, 0},
        {"set k x 0 1\r\n", PARSE_EINVALID, CMD_SET, 0},
        {"set k 0 0 4294967296\r\n", PARSE_EINVALID, CMD_SET, 0},
        {"set k 0 0\r\n", PARSE_EINVALID, CMD_SET, 0},
        {"incr k x\r\n", PARSE_EINVALID, CMD_INCR, 0},
        {"delete k 5\r\n", PARSE_EINVALID, CMD_DELETE, 0},
        {"verbosity\r\n", PARSE_EINVALID, CMD_VERBOSITY, 0},
        {"get a", PARSE_EUNFIN, CMD_MAX, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        struct request req;
        enum parse_status st = parse(rows[i].line, &req);
        CHECK(st == rows[i].status, rows[i].line);
        if (st == PARSE_OK) {
            CHECK(req.cmd == rows[i].cmd, rows[i].line);
            CHECK(req.noreply == rows[i].noreply, rows[i].line);
            CHECK(req.line_len == strlen(rows[i].line), rows[i].line);
        }
        if (st == PARSE_EINVALID)
            CHECK(req.error != NULL && req.line_len == strlen(rows[i].line), rows[i].line);
    }
}

static void test_fields(void)
{
    struct request req;
    CHECK(parse("cas key 4294967295 -1 10 18446744073709551615 noreply\r\n", &req) == PARSE_OK, "cas fields");
    CHECK(req.nkey == 3 && memcmp(req.key, "key", 3) == 0, "cas key");
    CHECK(req.flags == 4294967295u && req.exptime == -1 && req.vlen == 10, "cas numbers");
    CHECK(req.cas == 18446744073709551615ull && req.noreply, "cas unique");

    CHECK(parse("get  a   bb ccc\r\n", &req) == PARSE_OK, "get spaces");
    size_t pos = 0, n;
    const char *key;
    const char *want[] = {"a", "bb", "ccc"};
    for (int i = 0; i < 3; i++) {
        n = parse_next_key(req.keys, req.nkeys_len, &pos, &key);
        CHECK(n == strlen(want[i]) && memcmp(key, want[i], n) == 0, "get key list");
    }
    CHECK(parse_next_key(req.keys, req.nkeys_len, &pos, &key) == 0, "get key list end");

    CHECK(parse("incr k 18446744073709551615\r\n", &req) == PARSE_OK && req.delta == UINT64_MAX, "incr max");
    CHECK(parse("incr k 18446744073709551616\r\n", &req) == PARSE_EINVALID, "incr overflow");
    CHECK(parse("gat -1 k\r\n", &req) == PARSE_OK && req.exptime == -1, "gat exptime");
    CHECK(parse("stats items\r\n", &req) == PARSE_OK && req.narg == 5, "stats arg");
    CHECK(parse("site update_topkeys per-thread\r\n", &req) == PARSE_OK && req.narg == 14 && req.narg2 == 10 &&
              memcmp(req.arg2, "per-thread", 10) == 0,
          "site args");
    CHECK(parse("site\r\n", &req) == PARSE_EINVALID && strncmp(req.error, "CLIENT_ERROR usage: site", 24) == 0,
          "site usage");
}

static void test_limits(void)
{
    struct request req;
    char key[300], line[400];
    memset(key, 'k', sizeof(key));
    snprintf(line, sizeof(line), "set %.250s 0 0 1\r\n", key);
    CHECK(parse(line, &req) == PARSE_OK, "250-byte key");
    snprintf(line, sizeof(line), "set %.251s 0 0 1\r\n", key);
    CHECK(parse(line, &req) == PARSE_EINVALID, "251-byte key");

    static char big[KV_LINE_MAX + 10];
    memset(big, 'g', sizeof(big));
    CHECK(parse_request(big, KV_LINE_MAX - 1, &req) == PARSE_EUNFIN, "long line, no newline yet");
    CHECK(parse_request(big, sizeof(big), &req) == PARSE_EOVERSIZE, "line over the limit");
}

/* What a command line carries; compose() writes it as a client would. */
struct fields {
    enum command cmd;
    const char *key; /* the key, or a get's key list */
    uint32_t flags;
    int64_t exptime;
    uint64_t vlen, cas, delta;
    const char *arg;  /* stats group, verbosity level, site */
    const char *arg2; /* site: the mode */
    bool noreply;
};

static const char *const names[CMD_MAX] = {
#define X(id, name) [CMD_##id] = name,
    KV_COMMANDS(X)
#undef X
};

static void compose(const struct fields *f, char *buf, size_t size)
{
    const char *nr = f->noreply ? " noreply" : "";
    const char *name = names[f->cmd];
    long long exp = (long long)f->exptime;
    unsigned long long vlen = f->vlen, cas = f->cas, delta = f->delta;
    switch (f->cmd) {
    case CMD_GET: case CMD_GETS: snprintf(buf, size, "%s %s\r\n", name, f->key); break;
    case CMD_GAT: case CMD_GATS: snprintf(buf, size, "%s %lld %s\r\n", name, exp, f->key); break;
    case CMD_CAS: snprintf(buf, size, "cas %s %u %lld %llu %llu%s\r\n", f->key, f->flags, exp, vlen, cas, nr); break;
    case CMD_SET: case CMD_ADD: case CMD_REPLACE: case CMD_APPEND: case CMD_PREPEND:
        snprintf(buf, size, "%s %s %u %lld %llu%s\r\n", name, f->key, f->flags, exp, vlen, nr);
        break;
    case CMD_DELETE: snprintf(buf, size, "delete %s%s\r\n", f->key, nr); break;
    case CMD_INCR: case CMD_DECR: snprintf(buf, size, "%s %s %llu%s\r\n", name, f->key, delta, nr); break;
    case CMD_TOUCH: snprintf(buf, size, "touch %s %lld%s\r\n", f->key, exp, nr); break;
    case CMD_FLUSH_ALL: snprintf(buf, size, "flush_all %lld%s\r\n", exp, nr); break;
    case CMD_VERBOSITY: snprintf(buf, size, "verbosity %s%s\r\n", f->arg, nr); break;
    case CMD_STATS: snprintf(buf, size, f->arg ? "stats %s\r\n" : "stats\r\n", f->arg); break;
    case CMD_SITE: snprintf(buf, size, "site %s %s\r\n", f->arg, f->arg2); break;
    case CMD_VERSION: case CMD_QUIT: case CMD_MAX: snprintf(buf, size, "%s\r\n", name); break;
    }
}

static bool same(const char *p, size_t n, const char *want)
{
    return want == NULL ? n == 0 : n == strlen(want) && memcmp(p, want, n) == 0;
}

/* The parsed request carries back every field the line was composed from. */
static void check_trip(const struct fields *f)
{
    char line[512];
    struct request req;
    compose(f, line, sizeof(line));
    CHECK(parse(line, &req) == PARSE_OK, line);
    CHECK(req.cmd == f->cmd && req.line_len == strlen(line) && req.noreply == f->noreply, line);
    bool multi = f->cmd == CMD_GET || f->cmd == CMD_GETS || f->cmd == CMD_GAT || f->cmd == CMD_GATS;
    bool keyed = f->key != NULL && !multi;
    CHECK(multi ? same(req.keys, req.nkeys_len, f->key) : same(req.key, req.nkey, keyed ? f->key : NULL), line);
    CHECK(req.flags == f->flags && req.exptime == f->exptime && req.vlen == f->vlen, line);
    CHECK(req.cas == f->cas && req.delta == f->delta, line);
    if (f->cmd == CMD_STATS || f->cmd == CMD_SITE)
        CHECK(same(req.arg, req.narg, f->arg), line);
    if (f->cmd == CMD_SITE)
        CHECK(same(req.arg2, req.narg2, f->arg2), line);
}

static void test_round_trips(void)
{
    static const struct fields trips[] = {
        {.cmd = CMD_GET, .key = "a"},
        {.cmd = CMD_GET, .key = "a bb ccc"},
        {.cmd = CMD_GETS, .key = "k1 k2"},
        {.cmd = CMD_GAT, .key = "a b", .exptime = 100},
        {.cmd = CMD_GATS, .key = "a", .exptime = -1},
        {.cmd = CMD_SET, .key = "k", .flags = 7, .exptime = 0, .vlen = 3},
        {.cmd = CMD_SET, .key = "k", .flags = 4294967295u, .exptime = 2592001, .vlen = 0, .noreply = true},
        {.cmd = CMD_ADD, .key = "a-key", .flags = 1, .exptime = 60, .vlen = 10},
        {.cmd = CMD_REPLACE, .key = "r", .exptime = -1, .vlen = 2147483645, .noreply = true},
        {.cmd = CMD_APPEND, .key = "ap", .vlen = 5},
        {.cmd = CMD_PREPEND, .key = "pp", .flags = 2, .vlen = 1, .noreply = true},
        {.cmd = CMD_CAS, .key = "c", .flags = 3, .exptime = 9, .vlen = 4, .cas = 18446744073709551615ull},
        {.cmd = CMD_CAS, .key = "c", .vlen = 1, .cas = 1, .noreply = true},
        {.cmd = CMD_DELETE, .key = "d"},
        {.cmd = CMD_DELETE, .key = "d", .noreply = true},
        {.cmd = CMD_INCR, .key = "n", .delta = 18446744073709551615ull},
        {.cmd = CMD_DECR, .key = "n", .delta = 3, .noreply = true},
        {.cmd = CMD_TOUCH, .key = "t", .exptime = 30},
        {.cmd = CMD_TOUCH, .key = "t", .exptime = -1, .noreply = true},
        {.cmd = CMD_FLUSH_ALL, .exptime = 10},
        {.cmd = CMD_FLUSH_ALL, .exptime = 0, .noreply = true},
        {.cmd = CMD_VERSION},
        {.cmd = CMD_VERBOSITY, .arg = "1"},
        {.cmd = CMD_VERBOSITY, .arg = "0", .noreply = true},
        {.cmd = CMD_QUIT},
        {.cmd = CMD_STATS},
        {.cmd = CMD_STATS, .arg = "settings"},
        {.cmd = CMD_STATS, .arg = "timings"},
        {.cmd = CMD_SITE, .arg = "update_topkeys", .arg2 = "per-thread"},
        {.cmd = CMD_SITE, .arg = "all", .arg2 = "shared"},
    };
    bool seen[CMD_MAX] = {false};
    for (size_t i = 0; i < sizeof(trips) / sizeof(trips[0]); i++) {
        check_trip(&trips[i]);
        seen[trips[i].cmd] = true;
    }
    for (int c = 0; c < CMD_MAX; c++)
        CHECK(seen[c], names[c]); /* a command added to KV_COMMANDS needs its round trip */
}

int main(void)
{
    test_commands();
    test_fields();
    test_limits();
    test_round_trips();
    return checks_done("test_parse");
}
