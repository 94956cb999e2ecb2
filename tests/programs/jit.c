/* Code that runs from an anonymous executable mapping, as a JIT's does, for
 * tests/test_unwind.py: it has no file, no symbols, no unwind information.
 *
 *   jit [SECONDS]      prints "ready", spins in the generated code until
 *                      SECONDS (default 30) pass or stdin closes
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* mov ecx, 10000000; 1: dec ecx; jnz 1b; ret */
static const unsigned char spin_code[] = {0xb9, 0x80, 0x96, 0x98, 0x00, 0xff, 0xc9, 0x75, 0xfc, 0xc3};

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 30.0;
    void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 1;
    memcpy(page, spin_code, sizeof spin_code);
    void (*spin)(void) = (void (*)(void))page;
    struct pollfd in = {.fd = 0, .events = POLLIN};
    time_t end = time(NULL) + (time_t)seconds;
    printf("ready\n");
    fflush(stdout);
    while (time(NULL) < end && poll(&in, 1, 0) == 0)
        spin();
    return 0;
}
