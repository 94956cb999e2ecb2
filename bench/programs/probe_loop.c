/* A loop that fires one USDT probe per iteration, for bench/probe_cost.py.
 *
 *   probe_loop nop5|int3 N    fire probe_loop:hit N times (a 5-byte nop site,
 *                             which 6.18 kernels run through the optimized
 *                             uprobe path, or sdt.h's 1-byte nop: int3)
 *   probe_loop syscall N      make N getppid() syscalls
 *   probe_loop MODE N wait    first sleep 1.5 s, for a tracer to attach
 *
 * Prints the nanoseconds per iteration. The probes have no semaphore: a
 * detached site is a nop. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/sdt.h>

static void fire_int3(uint64_t i)
{
    STAP_PROBE1(probe_loop, hit1, i);
}

#undef _SDT_NOP
#define _SDT_NOP .nops 5
static void fire_nop5(uint64_t i)
{
    STAP_PROBE1(probe_loop, hit, i);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: probe_loop nop5|int3|syscall N [wait]\n");
        return 2;
    }
    long n = atol(argv[2]);
    if (argc == 4)
        usleep(1500000); /* time for the tracer to attach */
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++) {
        if (strcmp(argv[1], "nop5") == 0)
            fire_nop5((uint64_t)i);
        else if (strcmp(argv[1], "int3") == 0)
            fire_int3((uint64_t)i);
        else
            (void)getppid();
    }
    printf("%.1f\n", (double)(now_ns() - t0) / (double)n);
    return 0;
}
