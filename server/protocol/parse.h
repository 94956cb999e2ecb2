/* The text-protocol parser: a pure function over a buffer. It finds one
 * command line, tokenizes and validates it, and says how many bytes it used;
 * it never touches a connection, an item or a clock. */
#ifndef KV_PARSE_H
#define KV_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "opcodes.h"

#define KV_LINE_MAX 65536 /* longest command line accepted, "\r\n" included */

enum parse_status {
    PARSE_OK,        /* *req describes one complete command */
    PARSE_EUNFIN,    /* no complete line yet */
    PARSE_EINVALID,  /* a complete but bad line: reply req->error, skip req->line_len */
    PARSE_EOVERSIZE, /* no newline within the line limit: reply and drop the client */
};

/* Every command the parser knows: the request opcodes (opcodes.h,
 * so CMD_x == OP_x for those), then the ones that are not requests. */
#define KV_COMMANDS(X)                                                         \
    KV_OPCODES(X)                                                              \
    X(VERSION, "version")                                                      \
    X(VERBOSITY, "verbosity")                                                  \
    X(QUIT, "quit")                                                            \
    X(STATS, "stats")                                                          \
    X(SITE, "site")

enum command {
#define X(id, name) CMD_##id,
    KV_COMMANDS(X)
#undef X
    CMD_MAX
};

struct request {
    enum command cmd;
    size_t line_len;   /* bytes of the line, its "\n" included */
    const char *error; /* PARSE_EINVALID: the reply, "\r\n" included */
    bool noreply;
    const char *key; /* single-key commands */
    size_t nkey;
    const char *keys; /* get/gets/gat/gats: the key list, space separated */
    size_t nkeys_len;
    uint32_t flags;
    int64_t exptime; /* set family, touch, gat; flush_all's delay */
    uint64_t vlen;   /* storage commands: value bytes announced */
    uint64_t cas;
    uint64_t delta;
    const char *arg; /* stats group, or NULL; site: the site */
    size_t narg;
    const char *arg2; /* site: the mode */
    size_t narg2;
};

enum parse_status parse_request(const char *buf, size_t len, struct request *req);

/* Next key of a get-family key list at *pos, or 0 when there is none. */
size_t parse_next_key(const char *keys, size_t len, size_t *pos, const char **key);

#endif
