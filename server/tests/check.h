/* What the C unit tests share: CHECK() counts a failure and says where, and
 * checks_done() ends main with the count. */
#ifndef KV_TESTS_CHECK_H
#define KV_TESTS_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond, what)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "FAIL %s: %s (line %d)\n", what, #cond, __LINE__); \
            failures++;                                                        \
        }                                                                      \
    } while (0)

/* main's exit status: 0 when nothing failed. */
static inline int checks_done(const char *test)
{
    if (failures) {
        fprintf(stderr, "%s: %d failed\n", test, failures);
        return 1;
    }
    printf("%s: all passed\n", test);
    return 0;
}

#endif
