/* Executes the commands buffered on a connection and composes the replies. */
#ifndef KV_PROCESS_H
#define KV_PROCESS_H

#include "core/conn.h"
#include "storage/items.h"

/* Runs commands from c->rbuf until input runs out, output passes the high
 * water mark (returns 1: call again once it drained), or the connection is
 * closing. */
int process_commands(conn *c);
/* The replies in wbuf have been written: release their item objects. */
void process_release_copies(conn *c);
/* The connection is going away: drop a half-read item and any copies. */
void process_abort(conn *c);

/* Server-wide settings the protocol needs. */
struct settings {
    const char *iface;
    int port;
    int nthreads;
    size_t maxbytes;
    int maxconns;
    size_t item_size_max;
    int verbose;
    const char *preset;
    int probe_sample;
    const char *cpu_affinity; /* as given, "" when the workers are not pinned */
    int ncpus;                /* worker i runs on cpus[i % ncpus] when ncpus > 0 */
    int cpus[1024];
    enum key_compare key_compare;
};
extern struct settings settings;

#endif
