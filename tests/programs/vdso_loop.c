/* Calls clock_gettime in a loop, so samples land in the vdso, for
 * tests/test_unwind.py. Prints "ready"; runs SECONDS (default 30) or until
 * stdin closes. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv)
{
    struct timespec t;
    struct pollfd in = {.fd = 0, .events = POLLIN};
    time_t end = time(NULL) + (argc > 1 ? atoi(argv[1]) : 30);
    printf("ready\n");
    fflush(stdout);
    for (unsigned long n = 0; time(NULL) < end; n++)
        if (clock_gettime(CLOCK_MONOTONIC, &t) == 0 && n % 4096 == 0 && poll(&in, 1, 0) > 0)
            break;
    return 0;
}
