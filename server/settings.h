/* Server-wide settings, from the command line (main.c). Read by the core
 * (verbosity, CPU pinning) and the protocol (limits, `stats settings`);
 * defined by main.c (and by the fuzz harness, which has no main.c). */
#ifndef KV_SETTINGS_H
#define KV_SETTINGS_H

#include <stddef.h>

struct settings {
    const char *iface;
    int port;
    int nthreads;
    size_t maxbytes;
    int maxconns;
    size_t item_size_max;
    int verbose;
    int probe_sample; /* 0: paced, at probe_rate */
    int lock_sample;  /* 0: paced, at probe_rate */
    int probe_rate;
    long topkeys_hold_ns; /* kv_topkeys_hold_ns (stats/sites.h) */
    const char *cpu_affinity; /* as given, "" when the workers are not pinned */
    int ncpus;                /* worker i runs on cpus[i % ncpus] when ncpus > 0 */
    int cpus[1024];
};
extern struct settings settings;

#endif
