/* kvcached: a memcached-compatible cache server whose contention sites can
 * each be switched between the contended design and the fixed one, with
 * USDT probes at every one of them. See docs/kvcached.md. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/conn.h"
#include "core/listener.h"
#include "core/worker.h"
#include "cpulist.h"
#include "protocol/process.h"
#include "protocol/stats_out.h"
#include "settings.h"
#include "stats/sites.h"
#include "stats/stats.h"
#include "storage/items.h"
#include "trace.h"
#include "util.h"

struct settings settings;
int kv_probe_sample = KV_PROBE_SAMPLE_DEFAULT;
int kv_probe_rate = KV_PROBE_RATE_DEFAULT;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvcached [options]\n"
            "  -p PORT               TCP port (default 11211; 0 picks a free one)\n"
            "  -l ADDR               address to listen on (default 127.0.0.1)\n"
            "  -t N                  worker threads (default 4)\n"
            "  -m MB                 item memory limit in megabytes (default 64)\n"
            "  -c N                  max simultaneous connections (default 1024)\n"
            "  -I SIZE               max value size, k/m suffix allowed (default 1m)\n"
            "  -v                    log connections to stderr (-vv: more)\n"
            "  --preset P            baseline (all sites shared) or fixed (all per-thread);\n"
            "                        default baseline\n"
            "  --timings M           collect_timings: shared or per-thread\n"
            "  --topkeys M           update_topkeys: shared or per-thread\n"
            "  --item-counter M      on_create_item/on_delete_item: shared or per-thread\n"
            "  --memory-counter M    account_memory: shared or per-thread\n"
            "  --key-compare K       hash lookup's key comparison: inline (length check\n"
            "                        and memcmp, default) or indirect (through a pointer)\n"
            "  --probe-rate R        sampled probes fire about R times a second per thread\n"
            "                        and site, whatever the load (default %d)\n"
            "  --probe-sample N      per-request probes for 1 request in N instead (0: paced)\n"
            "  --lock-sample N       lock__wait__done for 1 short contended wait in N\n"
            "                        instead (0: paced)\n"
            "  --topkeys-hold-ns N   busy-wait N ns inside update_topkeys' critical section\n"
            "                        (a slower critical section, as across sockets; default 0)\n"
            "  --cpu-affinity LIST   pin worker i to the i-th CPU of LIST, round-robin\n"
            "                        (e.g. 0,1 or 0-3,8-11; default: not pinned)\n"
            "  -V, --version         print the version\n"
            "  -h, --help            this help\n",
            KV_PROBE_RATE_DEFAULT);
}

static void die_usage(const char *fmt, const char *arg) { cli_die("kvcached", fmt, arg); }

static long parse_long(const char *s, const char *what, long lo, long hi) { return cli_long("kvcached", s, what, lo, hi); }

static size_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == 0 && end != s && (*end == 'k' || *end == 'K'))
        v *= 1024, end++;
    else if (errno == 0 && end != s && (*end == 'm' || *end == 'M'))
        v *= 1024 * 1024, end++;
    if (errno != 0 || end == s || *end != '\0' || v < 1024 || v > 128ull * 1024 * 1024)
        die_usage("-I must be from 1k to 128m, not '%s'", s);
    return (size_t)v;
}

static enum site_mode parse_mode(const char *s, const char *flag)
{
    if (strcmp(s, "shared") == 0)
        return MODE_SHARED;
    if (strcmp(s, "per-thread") == 0)
        return MODE_PER_THREAD;
    char msg[96];
    snprintf(msg, sizeof(msg), "%s must be 'shared' or 'per-thread', not '%%s'", flag);
    die_usage(msg, s);
    return MODE_SHARED;
}

enum { OPT_PRESET = 256, OPT_TIMINGS, OPT_TOPKEYS, OPT_ITEMS, OPT_MEMORY, OPT_SAMPLE, OPT_LOCK_SAMPLE, OPT_RATE, OPT_CPUS, OPT_KEYCMP, OPT_HOLD };

static void parse_cpus(const char *list)
{
    char why[160];
    int max = (int)(sizeof(settings.cpus) / sizeof(settings.cpus[0]));
    settings.ncpus = cpulist_parse(list, settings.cpus, max, why, sizeof(why));
    if (settings.ncpus < 0)
        die_usage("--cpu-affinity %s", why);
    settings.cpu_affinity = list;
}

static void parse_args(int argc, char **argv, enum site_mode modes[SITES_MAX], enum key_compare *key_compare)
{
    static const struct option longopts[] = {
        {"preset", required_argument, NULL, OPT_PRESET},
        {"timings", required_argument, NULL, OPT_TIMINGS},
        {"topkeys", required_argument, NULL, OPT_TOPKEYS},
        {"item-counter", required_argument, NULL, OPT_ITEMS},
        {"memory-counter", required_argument, NULL, OPT_MEMORY},
        {"probe-sample", required_argument, NULL, OPT_SAMPLE},
        {"lock-sample", required_argument, NULL, OPT_LOCK_SAMPLE},
        {"probe-rate", required_argument, NULL, OPT_RATE},
        {"cpu-affinity", required_argument, NULL, OPT_CPUS},
        {"key-compare", required_argument, NULL, OPT_KEYCMP},
        {"topkeys-hold-ns", required_argument, NULL, OPT_HOLD},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    enum site_mode preset = MODE_SHARED;
    int site_set[SITES_MAX] = {0};
    enum site_mode site_val[SITES_MAX];
    int opt;

    settings = (struct settings){
        .iface = "127.0.0.1", .port = 11211, .nthreads = 4, .maxbytes = 64ull * 1024 * 1024,
        .maxconns = 1024, .item_size_max = 1024 * 1024, .verbose = 0, .probe_sample = KV_PROBE_SAMPLE_DEFAULT,
        .lock_sample = KV_LOCK_SAMPLE_DEFAULT, .probe_rate = KV_PROBE_RATE_DEFAULT,
        .cpu_affinity = "",
    };
    *key_compare = KEY_COMPARE_INLINE;
    while ((opt = getopt_long(argc, argv, "p:l:t:m:c:I:vVh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'p': settings.port = (int)parse_long(optarg, "-p", 0, 65535); break;
        case 'l': settings.iface = optarg; break;
        case 't': settings.nthreads = (int)parse_long(optarg, "-t", 1, KV_MAX_THREADS); break;
        case 'm': settings.maxbytes = (size_t)parse_long(optarg, "-m", 1, 1 << 20) * 1024 * 1024; break;
        case 'c': settings.maxconns = (int)parse_long(optarg, "-c", 1, 1 << 20); break;
        case 'I': settings.item_size_max = parse_size(optarg); break;
        case 'v': settings.verbose++; break;
        case 'V': printf("kvcached %s\n", KV_VERSION); exit(0);
        case 'h': usage(stdout); exit(0);
        case OPT_PRESET:
            if (strcmp(optarg, "baseline") == 0)
                preset = MODE_SHARED;
            else if (strcmp(optarg, "fixed") == 0)
                preset = MODE_PER_THREAD;
            else
                die_usage("--preset must be 'baseline' or 'fixed', not '%s'", optarg);
            break;
        case OPT_TIMINGS:
        case OPT_TOPKEYS:
        case OPT_ITEMS:
        case OPT_MEMORY: {
            int s = opt - OPT_TIMINGS;
            site_set[s] = 1;
            site_val[s] = parse_mode(optarg, site_flag((enum site_id)s));
            break;
        }
        case OPT_SAMPLE: settings.probe_sample = (int)parse_long(optarg, "--probe-sample", 0, 1 << 30); break;
        case OPT_LOCK_SAMPLE: settings.lock_sample = (int)parse_long(optarg, "--lock-sample", 0, 1 << 30); break;
        case OPT_RATE: settings.probe_rate = (int)parse_long(optarg, "--probe-rate", 1, 1000000); break;
        case OPT_CPUS: parse_cpus(optarg); break;
        case OPT_HOLD: settings.topkeys_hold_ns = parse_long(optarg, "--topkeys-hold-ns", 0, 1000000000); break;
        case OPT_KEYCMP:
            if (strcmp(optarg, "inline") == 0)
                *key_compare = KEY_COMPARE_INLINE;
            else if (strcmp(optarg, "indirect") == 0)
                *key_compare = KEY_COMPARE_INDIRECT;
            else
                die_usage("--key-compare must be 'inline' or 'indirect', not '%s'", optarg);
            break;
        default: usage(stderr); exit(EX_USAGE);
        }
    }
    if (optind < argc)
        die_usage("unexpected argument '%s'", argv[optind]);
    /* a site's own flag wins over the preset, whatever their order */
    for (int s = 0; s < SITES_MAX; s++)
        modes[s] = site_set[s] ? site_val[s] : preset;
    kv_probe_sample = settings.probe_sample;
    kv_lock_sample = settings.lock_sample;
    kv_probe_rate = settings.probe_rate;
    kv_topkeys_hold_ns = settings.topkeys_hold_ns;
}

int main(int argc, char **argv)
{
    enum site_mode modes[SITES_MAX];
    enum key_compare key_compare;
    int bound = 0, status = 1;
    parse_args(argc, argv, modes, &key_compare);
    kv_thread_idx = settings.nthreads; /* the main thread's slot */
    kv_started_ns = now_ns();
    conn_set_handler(&protocol_handler); /* the core serves connections through the protocol's callbacks */

    /* bottom-up; torn down in reverse */
    if (listener_signals_setup() != 0) {
        perror("kvcached: signals");
        return 1;
    }
    if (stats_setup(settings.nthreads) != 0 || sites_setup(settings.nthreads, modes) != 0 ||
        items_setup(settings.maxbytes, settings.item_size_max, key_compare) != 0 || workers_setup(settings.nthreads) != 0) {
        fprintf(stderr, "kvcached: out of memory at start-up\n");
        goto out;
    }
    if (listener_setup(settings.iface, settings.port, &bound) < 0)
        goto out;
    settings.port = bound;
    if (workers_start() != 0)
        goto out;
    fprintf(stderr, "kvcached %s listening on %s:%d (%d worker%s, preset %s)\n", KV_VERSION, settings.iface, bound,
            settings.nthreads, settings.nthreads == 1 ? "" : "s", sites_preset());
    int sig = listener_run(settings.maxconns);
    if (sig > 0 && settings.verbose > 0)
        fprintf(stderr, "kvcached: %s, shutting down\n", strsignal(sig));
    status = sig > 0 ? 0 : 1;
out:
    workers_stop();
    listener_teardown();
    workers_teardown();
    items_teardown();
    sites_teardown();
    stats_teardown();
    return status;
}
