#include "loadgen/workload.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loadgen/options.h"

#define VERIFY_MAGIC "kvl1"

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t rng_next(uint64_t *s) /* xorshift64* */
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static double *zipf_cdf; /* num_items entries when --key-dist zipf */

void zipf_setup(void)
{
    zipf_cdf = malloc((size_t)opt.num_items * sizeof(double));
    if (zipf_cdf == NULL) {
        fprintf(stderr, "kvload: out of memory for the zipf table\n");
        exit(1);
    }
    double sum = 0;
    for (long i = 0; i < opt.num_items; i++)
        sum += 1.0 / pow((double)(i + 1), opt.zipf_s);
    double acc = 0;
    for (long i = 0; i < opt.num_items; i++) {
        acc += 1.0 / pow((double)(i + 1), opt.zipf_s) / sum;
        zipf_cdf[i] = acc;
    }
    zipf_cdf[opt.num_items - 1] = 1.0;
}

void zipf_teardown(void)
{
    free(zipf_cdf);
    zipf_cdf = NULL;
}

long pick_key(uint64_t *rng)
{
    if (zipf_cdf == NULL)
        return (long)(rng_next(rng) % (uint64_t)opt.num_items);
    double u = (double)(rng_next(rng) >> 11) / (double)(1ull << 53);
    long lo = 0, hi = opt.num_items - 1;
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        if (zipf_cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int key_name(char *buf, long k) { return sprintf(buf, "%s%ld", opt.prefix, k); }

static uint64_t fnv1a(const char *p, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* With --verify a value is "kvl1:<16 hex checksum>:" + payload, the
 * checksum covering the key and the payload, so a value written by anyone
 * else, or for another key, or truncated, fails the check. */
void make_value(char *dst, int n, const char *key, int nkey, uint64_t *rng)
{
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    int start = opt.verify ? 22 : 0;
    uint64_t r = rng_next(rng);
    for (int i = start; i < n; i++) {
        if ((i & 7) == 0)
            r = rng_next(rng);
        dst[i] = alphabet[(r >> ((i & 7) * 8)) % 62];
    }
    if (opt.verify) {
        uint64_t h = fnv1a(dst + 22, (size_t)(n - 22), fnv1a(key, (size_t)nkey, 1469598103934665603ull));
        char head[24];
        snprintf(head, sizeof(head), VERIFY_MAGIC ":%016llx:", (unsigned long long)h);
        memcpy(dst, head, 22);
    }
}

bool check_value(const char *v, size_t n, const char *key, size_t nkey)
{
    if (n < 22 || memcmp(v, VERIFY_MAGIC ":", 5) != 0 || v[21] != ':')
        return false;
    uint64_t h = fnv1a(v + 22, n - 22, fnv1a(key, nkey, 1469598103934665603ull));
    char hex[17];
    snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)h);
    return memcmp(v + 5, hex, 16) == 0;
}
