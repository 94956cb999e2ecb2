/* A hot leaf called back from glibc's qsort and another called directly,
 * for tests/test_unwind.py. Built there with -O2 -fomit-frame-pointer (the
 * distribution default): neither this program nor glibc keeps frame pointers.
 *
 *   unwind_qsort [SECONDS]      (default 30; exits early when stdin closes)
 *
 * main -> work_round -> sort_batch -> qsort -> ... -> compare_keys
 *                    -> mix_direct
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned sink;

__attribute__((noinline)) int compare_keys(const void *a, const void *b)
{
    unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
    for (int i = 0; i < 20; i++) {
        x = x * 1103515245u + 12345u;
        y = y * 1103515245u + 12345u;
    }
    return (x > y) - (x < y);
}

__attribute__((noinline)) unsigned sort_batch(unsigned *v, int n)
{
    qsort(v, n, sizeof *v, compare_keys);
    return v[0] ^ v[n - 1]; /* not a tail call: sort_batch stays on the stack */
}

__attribute__((noinline)) unsigned mix_direct(const unsigned *v, int n)
{
    unsigned h = 0;
    for (int r = 0; r < 200; r++)
        for (int i = 0; i < n; i++)
            h = h * 31 + v[i] * 7;
    return h;
}

__attribute__((noinline)) void work_round(unsigned *v, int n)
{
    for (int i = 0; i < n; i++)
        v[i] = (unsigned)rand();
    sink += sort_batch(v, n);
    sink += mix_direct(v, n);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    double end = now() + (argc > 1 ? atof(argv[1]) : 30.0);
    static unsigned v[4096];
    struct pollfd in = {.fd = 0, .events = POLLIN};
    printf("ready\n");
    fflush(stdout);
    while (now() < end) {
        work_round(v, 4096);
        if (poll(&in, 1, 0) > 0) /* stdin closed (or written to): stop */
            break;
    }
    return 0;
}
