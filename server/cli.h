/* Command-line pieces shared by kvcached and kvload: the usage error and the
 * bounded number, each said in one line that names the program. */
#ifndef KV_CLI_H
#define KV_CLI_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#define EX_USAGE 64

/* Prints "PROG: <fmt with arg> (see PROG --help)" and exits with EX_USAGE. */
static inline void cli_die(const char *prog, const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see %s --help)\n", prog);
    exit(EX_USAGE);
}

/* `s` as a number from lo to hi, or cli_die() saying what it must be. */
static inline long cli_long(const char *prog, const char *s, const char *what, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        char msg[160];
        snprintf(msg, sizeof(msg), "%s must be a number from %ld to %ld, not '%%s'", what, lo, hi);
        cli_die(prog, msg, s);
    }
    return v;
}

#endif
