/* What kvload sends: the clock, its random numbers, which key a request
 * names (uniform or zipf) and the values it stores, which --verify makes
 * checkable. */
#ifndef KVLOAD_WORKLOAD_H
#define KVLOAD_WORKLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KEY_MAX 250

uint64_t now_ns(void);
uint64_t rng_next(uint64_t *s);

/* The zipf table of --key-dist zipf:S over --num-items keys; without it
 * keys are uniform. */
void zipf_setup(void);
void zipf_teardown(void);
long pick_key(uint64_t *rng);

/* The name of key k (the prefix, then k) in buf, which holds KEY_MAX + 1. */
int key_name(char *buf, long k);

/* A value of n bytes for a key; with --verify it carries a checksum of the
 * key and the payload, which check_value() checks. */
void make_value(char *dst, int n, const char *key, int nkey, uint64_t *rng);
bool check_value(const char *v, size_t n, const char *key, size_t nkey);

#endif
