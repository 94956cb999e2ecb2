/* kvload's command line: cbc-pillowfight's options, parsed once into `opt`,
 * which every other file of kvload reads and none writes. */
#ifndef KVLOAD_OPTIONS_H
#define KVLOAD_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

struct options {
    char host[256];
    char port[16];
    int threads, connections, batch;
    long num_items;
    int min_size, max_size, set_pct;
    long num_cycles; /* batches per connection; -1: until --duration */
    double duration; /* seconds; 0: until --num-cycles */
    bool populate_only, no_population, verify, json, quiet;
    double zipf_s; /* 0: uniform */
    char prefix[64];
    uint64_t seed;
    int ncpus; /* thread i runs on cpus[i % ncpus] when > 0 */
    int cpus[1024];
};

extern struct options opt;

/* Fills `opt` from the command line; prints the usage and exits on -h (0)
 * or on a bad option (EX_USAGE). */
void options_parse(int argc, char **argv);

#endif
