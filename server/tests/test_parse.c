/* Unit tests of the pure parser: one table row per behaviour, run by
 * `make -C server check`. */
#include <stdio.h>
#include <string.h>

#include "protocol/parse.h"

static int failures;

#define CHECK(cond, what)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "FAIL %s: %s (line %d)\n", what, #cond, __LINE__); \
            failures++;                                                        \
        }                                                                      \
    } while (0)

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

int main(void)
{
    test_commands();
    test_fields();
    test_limits();
    if (failures) {
        fprintf(stderr, "test_parse: %d failed\n", failures);
        return 1;
    }
    printf("test_parse: all passed\n");
    return 0;
}
