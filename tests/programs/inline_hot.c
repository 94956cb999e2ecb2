/* A hot function inlined into its caller, for tests/test_inline.py: built
 * there with -O2 -g, so the DWARF says where mix_keys was inlined. Also the
 * stripped program of tests/test_debuginfod.py, whose hash_round only the
 * debug file a debuginfod server holds names.
 *
 *   inline_hot [SECONDS]      (default 30; exits early when stdin closes)
 *
 * main -> hash_round -> mix_keys (inlined: no call, no symbol of its own)
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile unsigned sink;

static inline __attribute__((always_inline)) unsigned mix_keys(unsigned x)
{
    for (int i = 0; i < 100000; i++)
        x = (x ^ (x >> 7)) * 1103515245u + 12345u;
    return x;
}

__attribute__((noinline)) unsigned hash_round(unsigned seed)
{
    unsigned h = mix_keys(seed);
    return h ^ (h >> 3); /* not a tail call: hash_round keeps a body of its own */
}

int main(int argc, char **argv)
{
    struct pollfd in = {.fd = 0, .events = POLLIN};
    unsigned seed = 1;
    alarm(argc > 1 ? (unsigned)atoi(argv[1]) : 30); /* bounded: SIGALRM ends it */
    puts("ready");
    fflush(stdout);
    do
        sink = seed = hash_round(seed);
    while (poll(&in, 1, 0) == 0); /* until stdin closes (or is written to) */
    return 0;
}
