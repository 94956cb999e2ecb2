/* A hot C++ method that GCC 12 at -O2 emits only as a clone, for
 * tests/test_stripped.py: Table::fingerprint is called on one object, so GCC
 * propagates `this` into a copy named _ZNK...fingerprintEm.constprop.0 (its
 * interprocedural SRA gives .isra.0 on other shapes), which the views must show
 * demangled, `...Table::fingerprint(unsigned long) const [clone .constprop.0]`.
 *
 *   clone_method [SECONDS]      (default 30; exits early when stdin closes)
 */
#include <poll.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {
struct Table {
    uint64_t seed;
    uint64_t salt;
    __attribute__((noinline)) uint64_t fingerprint(unsigned long n) const;
};
}  // namespace

uint64_t Table::fingerprint(unsigned long n) const
{
    uint64_t h = seed;
    for (unsigned long i = 0; i < n; i++)
        h ^= salt + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
}

static volatile uint64_t sink;

int main(int argc, char **argv)
{
    static Table table;
    struct pollfd in = {0, POLLIN, 0};
    table.seed = (uint64_t)argc;
    table.salt = (uint64_t)getpid();
    alarm(argc > 1 ? (unsigned)atoi(argv[1]) : 30); /* bounded: SIGALRM ends it */
    puts("ready");
    fflush(stdout);
    do
        sink = sink + table.fingerprint((unsigned long)argc << 16);
    while (poll(&in, 1, 0) == 0); /* until stdin closes (or is written to) */
    return 0;
}
