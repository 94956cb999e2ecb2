#include "loadgen/options.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cpulist.h"

struct options opt;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvload [options]\n"
            "  --server HOST:PORT      server to load (default 127.0.0.1:11211)\n"
            "  --num-threads N         client threads (default 1)\n"
            "  --connections N         connections per thread (default 1)\n"
            "  --batch-size N          requests in flight per connection (default 1)\n"
            "  --num-items N           distinct keys (default 1000)\n"
            "  --min-size N            smallest value in bytes (default 50)\n"
            "  --max-size N            largest value in bytes (default 5120)\n"
            "  --set-pct P             percentage of requests that are sets (default 33)\n"
            "  --num-cycles N          batches per connection, then stop (-1: no limit)\n"
            "  --duration SEC          stop after SEC seconds (default 10 without --num-cycles)\n"
            "  --populate-only         store every key once, then exit\n"
            "  --no-population         skip storing every key before the run\n"
            "  --key-dist D            uniform (default) or zipf:S, e.g. zipf:0.99\n"
            "  --key-prefix P          key prefix (default kvload:)\n"
            "  --verify                checksum every value and check every value read\n"
            "  --seed N                random seed (default 1)\n"
            "  --cpu-affinity LIST     pin thread i to the i-th CPU of LIST, round-robin (e.g. 0,1)\n"
            "  --json                  end with one JSON object on stdout\n"
            "  --quiet                 no progress on stderr\n"
            "  -h, --help              this help\n"
            "exit status: 0 ok, 1 errors or verify mismatches, 2 cannot connect, 64 bad usage\n");
}

static void die_usage(const char *fmt, const char *arg) { cli_die("kvload", fmt, arg); }

static long num_arg(const char *s, const char *name, long lo, long hi) { return cli_long("kvload", s, name, lo, hi); }

enum {
    O_SERVER = 256, O_THREADS, O_CONNS, O_BATCH, O_ITEMS, O_MIN, O_MAX, O_SETPCT, O_CYCLES, O_DURATION,
    O_POPONLY, O_NOPOP, O_KEYDIST, O_PREFIX, O_VERIFY, O_SEED, O_JSON, O_QUIET, O_CPUS,
};

static const struct option longopts[] = {
    {"server", required_argument, NULL, O_SERVER},
    {"num-threads", required_argument, NULL, O_THREADS},
    {"connections", required_argument, NULL, O_CONNS},
    {"batch-size", required_argument, NULL, O_BATCH},
    {"num-items", required_argument, NULL, O_ITEMS},
    {"min-size", required_argument, NULL, O_MIN},
    {"max-size", required_argument, NULL, O_MAX},
    {"set-pct", required_argument, NULL, O_SETPCT},
    {"num-cycles", required_argument, NULL, O_CYCLES},
    {"duration", required_argument, NULL, O_DURATION},
    {"populate-only", no_argument, NULL, O_POPONLY},
    {"no-population", no_argument, NULL, O_NOPOP},
    {"key-dist", required_argument, NULL, O_KEYDIST},
    {"key-prefix", required_argument, NULL, O_PREFIX},
    {"verify", no_argument, NULL, O_VERIFY},
    {"seed", required_argument, NULL, O_SEED},
    {"json", no_argument, NULL, O_JSON},
    {"quiet", no_argument, NULL, O_QUIET},
    {"cpu-affinity", required_argument, NULL, O_CPUS},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static void set_defaults(void)
{
    strcpy(opt.host, "127.0.0.1");
    strcpy(opt.port, "11211");
    strcpy(opt.prefix, "kvload:");
    opt.threads = opt.connections = opt.batch = 1;
    opt.num_items = 1000;
    opt.min_size = 50;
    opt.max_size = 5120;
    opt.set_pct = 33;
    opt.num_cycles = -1;
    opt.seed = 1;
}

static void parse_server(const char *arg)
{
    const char *colon = strrchr(arg, ':');
    if (colon == NULL || colon == arg || (size_t)(colon - arg) >= sizeof(opt.host) ||
        strlen(colon + 1) >= sizeof(opt.port))
        die_usage("--server must be HOST:PORT, not '%s'", arg);
    memcpy(opt.host, arg, (size_t)(colon - arg));
    opt.host[colon - arg] = '\0';
    num_arg(colon + 1, "the port", 1, 65535);
    strcpy(opt.port, colon + 1);
}

static void parse_duration(const char *arg)
{
    char *end;
    opt.duration = strtod(arg, &end);
    if (end == arg || *end || !(opt.duration > 0) || opt.duration > 86400)
        die_usage("--duration must be seconds, more than 0, not '%s'", arg);
}

static void parse_key_dist(const char *arg)
{
    if (strcmp(arg, "uniform") == 0) {
        opt.zipf_s = 0;
    } else if (strncmp(arg, "zipf:", 5) == 0) {
        char *end;
        opt.zipf_s = strtod(arg + 5, &end);
        if (end == arg + 5 || *end || !(opt.zipf_s > 0) || opt.zipf_s > 10)
            die_usage("--key-dist zipf:S needs 0 < S <= 10, not '%s'", arg);
    } else {
        die_usage("--key-dist must be uniform or zipf:S, not '%s'", arg);
    }
}

static void parse_prefix(const char *arg)
{
    if (strlen(arg) >= sizeof(opt.prefix) || strchr(arg, ' '))
        die_usage("--key-prefix must be under 64 bytes without spaces, not '%s'", arg);
    strcpy(opt.prefix, arg);
}

static void parse_cpus(const char *arg)
{
    char why[160];
    opt.ncpus = cpulist_parse(arg, opt.cpus, (int)(sizeof(opt.cpus) / sizeof(opt.cpus[0])), why, sizeof(why));
    if (opt.ncpus < 0)
        die_usage("--cpu-affinity %s", why);
}

/* One option of getopt_long's; *cycles and *duration say whether a limit was given. */
static void set_option(int c, const char *arg, bool *cycles, bool *duration)
{
    switch (c) {
    case O_SERVER: parse_server(arg); break;
    case O_THREADS: opt.threads = (int)num_arg(arg, "--num-threads", 1, 256); break;
    case O_CONNS: opt.connections = (int)num_arg(arg, "--connections", 1, 4096); break;
    case O_BATCH: opt.batch = (int)num_arg(arg, "--batch-size", 1, 10000); break;
    case O_ITEMS: opt.num_items = num_arg(arg, "--num-items", 1, 100000000); break;
    case O_MIN: opt.min_size = (int)num_arg(arg, "--min-size", 1, 1 << 20); break;
    case O_MAX: opt.max_size = (int)num_arg(arg, "--max-size", 1, 1 << 20); break;
    case O_SETPCT: opt.set_pct = (int)num_arg(arg, "--set-pct", 0, 100); break;
    case O_CYCLES:
        opt.num_cycles = num_arg(arg, "--num-cycles", -1, 1L << 40);
        *cycles = opt.num_cycles >= 0;
        break;
    case O_DURATION:
        parse_duration(arg);
        *duration = true;
        break;
    case O_POPONLY: opt.populate_only = true; break;
    case O_NOPOP: opt.no_population = true; break;
    case O_KEYDIST: parse_key_dist(arg); break;
    case O_PREFIX: parse_prefix(arg); break;
    case O_VERIFY: opt.verify = true; break;
    case O_CPUS: parse_cpus(arg); break;
    case O_SEED: opt.seed = (uint64_t)num_arg(arg, "--seed", 0, 0x7fffffffffffffffL); break;
    case O_JSON: opt.json = true; break;
    case O_QUIET: opt.quiet = true; break;
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); exit(EX_USAGE);
    }
}

void options_parse(int argc, char **argv)
{
    bool cycles_set = false, duration_set = false;
    set_defaults();
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1)
        set_option(c, optarg, &cycles_set, &duration_set);
    if (optind < argc)
        die_usage("unexpected argument '%s'", argv[optind]);
    if (opt.min_size > opt.max_size)
        die_usage("--min-size must not exceed --max-size%s", "");
    if (opt.verify && opt.min_size < 40)
        die_usage("--verify needs --min-size of at least 40 (the checksum header)%s", "");
    if (!cycles_set && !duration_set)
        opt.duration = 10;
    if (opt.populate_only && opt.no_population)
        die_usage("--populate-only and --no-population contradict each other%s", "");
}
