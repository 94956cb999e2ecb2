/* Small always-inline helpers shared by every module: clocks, the TSC, hashing. */
#ifndef KV_UTIL_H
#define KV_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define KV_VERSION "0.1.0"
/* What `version` answers: one word (clients split stats on spaces),
 * memcached-style number first since libmemcached parses it. */
#define KV_PROTOCOL_VERSION "1.6.0-kvcached-" KV_VERSION
#define KV_CACHELINE 64
#define KV_ALIGNED __attribute__((aligned(KV_CACHELINE)))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define KV_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#define KV_MAX_THREADS 64

/* Monotonic nanoseconds. With the TSC as clocksource this is a vDSO call,
 * not a syscall (its cost: docs/server.md). */
static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t ns_from_s(uint64_t s) { return s * 1000000000ull; }

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
/* Fenced on both sides so the update in between is what gets measured, not
 * whatever the out-of-order core overlapped with it. */
static inline uint64_t tsc_begin(void)
{
    _mm_lfence();
    return __rdtsc();
}
static inline uint64_t tsc_end(void)
{
    unsigned aux;
    uint64_t t = __rdtscp(&aux);
    _mm_lfence();
    return t;
}
#else
static inline uint64_t tsc_begin(void) { return now_ns(); }
static inline uint64_t tsc_end(void) { return now_ns(); }
#endif

/* FNV-1a, 64-bit, folded: keys are short (<= 250 bytes) and this needs no
 * tables. The upper half picks the bucket, so fold it in. */
static inline uint64_t kv_hash(const char *key, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

/* Index of the current thread: workers are 0..N-1, any other thread N. */
extern __thread int kv_thread_idx;

#endif
