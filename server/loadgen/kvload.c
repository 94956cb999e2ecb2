/* kvload: a pipelined, multi-threaded load generator for the memcached text
 * protocol, with cbc-pillowfight's options. Each thread drives its
 * connections from one epoll loop; each connection sends a batch of
 * --batch-size requests at once (the sets as pipelined `set`s, the gets as
 * one multi-key `get`), reads every reply, and starts the next batch.
 *
 * Latency of a request is the time from its batch being sent to its reply
 * being read, recorded in per-thread log-linear histograms that are merged
 * (counts added, never percentiles averaged) at the end. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cpulist.h"

#define KEY_MAX 250
#define VERIFY_MAGIC "kvl1"

/* ---- options ------------------------------------------------------------ */

static struct {
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
} opt;

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

static void parse_args(int argc, char **argv)
{
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
    bool cycles_set = false, duration_set = false;
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
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_SERVER: {
            const char *colon = strrchr(optarg, ':');
            if (colon == NULL || colon == optarg || (size_t)(colon - optarg) >= sizeof(opt.host) ||
                strlen(colon + 1) >= sizeof(opt.port))
                die_usage("--server must be HOST:PORT, not '%s'", optarg);
            memcpy(opt.host, optarg, (size_t)(colon - optarg));
            opt.host[colon - optarg] = '\0';
            num_arg(colon + 1, "the port", 1, 65535);
            strcpy(opt.port, colon + 1);
            break;
        }
        case O_THREADS: opt.threads = (int)num_arg(optarg, "--num-threads", 1, 256); break;
        case O_CONNS: opt.connections = (int)num_arg(optarg, "--connections", 1, 4096); break;
        case O_BATCH: opt.batch = (int)num_arg(optarg, "--batch-size", 1, 10000); break;
        case O_ITEMS: opt.num_items = num_arg(optarg, "--num-items", 1, 100000000); break;
        case O_MIN: opt.min_size = (int)num_arg(optarg, "--min-size", 1, 1 << 20); break;
        case O_MAX: opt.max_size = (int)num_arg(optarg, "--max-size", 1, 1 << 20); break;
        case O_SETPCT: opt.set_pct = (int)num_arg(optarg, "--set-pct", 0, 100); break;
        case O_CYCLES:
            opt.num_cycles = num_arg(optarg, "--num-cycles", -1, 1L << 40);
            cycles_set = opt.num_cycles >= 0;
            break;
        case O_DURATION: {
            char *end;
            opt.duration = strtod(optarg, &end);
            if (end == optarg || *end || !(opt.duration > 0) || opt.duration > 86400)
                die_usage("--duration must be seconds, more than 0, not '%s'", optarg);
            duration_set = true;
            break;
        }
        case O_POPONLY: opt.populate_only = true; break;
        case O_NOPOP: opt.no_population = true; break;
        case O_KEYDIST:
            if (strcmp(optarg, "uniform") == 0) {
                opt.zipf_s = 0;
            } else if (strncmp(optarg, "zipf:", 5) == 0) {
                char *end;
                opt.zipf_s = strtod(optarg + 5, &end);
                if (end == optarg + 5 || *end || !(opt.zipf_s > 0) || opt.zipf_s > 10)
                    die_usage("--key-dist zipf:S needs 0 < S <= 10, not '%s'", optarg);
            } else {
                die_usage("--key-dist must be uniform or zipf:S, not '%s'", optarg);
            }
            break;
        case O_PREFIX:
            if (strlen(optarg) >= sizeof(opt.prefix) || strchr(optarg, ' '))
                die_usage("--key-prefix must be under 64 bytes without spaces, not '%s'", optarg);
            strcpy(opt.prefix, optarg);
            break;
        case O_VERIFY: opt.verify = true; break;
        case O_CPUS: {
            char why[160];
            opt.ncpus = cpulist_parse(optarg, opt.cpus, (int)(sizeof(opt.cpus) / sizeof(opt.cpus[0])), why,
                                      sizeof(why));
            if (opt.ncpus < 0)
                die_usage("--cpu-affinity %s", why);
            break;
        }
        case O_SEED: opt.seed = (uint64_t)num_arg(optarg, "--seed", 0, 0x7fffffffffffffffL); break;
        case O_JSON: opt.json = true; break;
        case O_QUIET: opt.quiet = true; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); exit(EX_USAGE);
        }
    }
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

/* ---- time, randomness, keys, values ------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s) /* xorshift64* */
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static double *zipf_cdf; /* num_items entries when --key-dist zipf */

static void zipf_setup(void)
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

static long pick_key(uint64_t *rng)
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

static int key_name(char *buf, long k) { return sprintf(buf, "%s%ld", opt.prefix, k); }

static uint64_t fnv1a(const char *p, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* A value of n bytes for key k. With --verify it is
 * "kvl1:<16 hex checksum>:" + payload, the checksum covering the key and
 * the payload, so a value written by anyone else, or for another key, or
 * truncated, fails the check. */
static void make_value(char *dst, int n, const char *key, int nkey, uint64_t *rng)
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

static bool check_value(const char *v, size_t n, const char *key, size_t nkey)
{
    if (n < 22 || memcmp(v, VERIFY_MAGIC ":", 5) != 0 || v[21] != ':')
        return false;
    uint64_t h = fnv1a(v + 22, n - 22, fnv1a(key, nkey, 1469598103934665603ull));
    char hex[17];
    snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)h);
    return memcmp(v + 5, hex, 16) == 0;
}

/* ---- latency histogram ----------------------------------------------------- */

/* Log-linear, HDR style: values in ns, 2^k buckets each split in 32 linear
 * sub-buckets, so every recorded value is within ~3 % of its bucket. */
#define SUB_BITS 5
#define SUB (1 << SUB_BITS)
#define HBUCKETS (64 * SUB)

struct hist {
    uint64_t count[HBUCKETS];
    uint64_t max;
};

static unsigned hist_index(uint64_t v)
{
    if (v < SUB)
        return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    unsigned shift = msb - SUB_BITS;
    return (shift + 1) * SUB + (unsigned)((v >> shift) & (SUB - 1));
}

static uint64_t hist_value(unsigned idx) /* upper edge of a bucket */
{
    if (idx < SUB)
        return idx;
    unsigned shift = idx / SUB - 1;
    uint64_t base = (uint64_t)(SUB + idx % SUB) << shift;
    return base + ((1ull << shift) - 1);
}

static void hist_add(struct hist *h, uint64_t v)
{
    h->count[hist_index(v)]++;
    if (v > h->max)
        h->max = v;
}

static uint64_t hist_pct(const struct hist *h, double q)
{
    uint64_t total = 0, seen = 0;
    for (unsigned i = 0; i < HBUCKETS; i++)
        total += h->count[i];
    if (total == 0)
        return 0;
    uint64_t rank = (uint64_t)ceil(q * (double)total);
    if (rank == 0)
        rank = 1;
    for (unsigned i = 0; i < HBUCKETS; i++) {
        seen += h->count[i];
        if (seen >= rank) {
            uint64_t v = hist_value(i);
            return v < h->max ? v : h->max;
        }
    }
    return h->max;
}

/* ---- connections ----------------------------------------------------------- */

struct counters {
    uint64_t ops, gets, sets, hits, misses, errors, mismatches;
};

struct conn {
    int fd;
    char *out;
    size_t out_len, out_sent, out_cap;
    char *in;
    size_t in_len, in_cap;
    /* the batch in flight */
    int nsets, ngets;
    int sets_left;   /* STORED lines still expected */
    bool get_pending; /* VALUE..END still expected */
    long *get_keys;  /* key numbers of the batch's gets, in order */
    int get_seen;
    uint64_t sent_at;
    long cycles;
    bool done;
};

struct thread {
    pthread_t tid;
    int idx;
    uint64_t rng;
    struct conn *conns;
    struct counters n;
    struct hist hist;
    long populate_from, populate_to;
    int connect_failed;
    char *value_buf;
};

static volatile int stop_flag;
static uint64_t run_deadline; /* ns, 0: none */
static uint64_t progress_ops[256];

static int connect_server(void)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    if (getaddrinfo(opt.host, opt.port, &hints, &res) != 0)
        return -1;
    int fd = -1;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    return fd;
}

static void out_need(struct conn *c, size_t n)
{
    if (c->out_len + n <= c->out_cap)
        return;
    while (c->out_len + n > c->out_cap)
        c->out_cap = c->out_cap ? c->out_cap * 2 : 65536;
    c->out = realloc(c->out, c->out_cap);
    if (c->out == NULL) {
        fprintf(stderr, "kvload: out of memory\n");
        exit(1);
    }
}

static void append_set(struct thread *t, struct conn *c, long k)
{
    char key[KEY_MAX + 1];
    int nkey = key_name(key, k);
    int size = opt.min_size + (int)(rng_next(&t->rng) % (uint64_t)(opt.max_size - opt.min_size + 1));
    out_need(c, (size_t)nkey + (size_t)size + 64);
    c->out_len += (size_t)sprintf(c->out + c->out_len, "set %s 0 0 %d\r\n", key, size);
    make_value(c->out + c->out_len, size, key, nkey, &t->rng);
    c->out_len += (size_t)size;
    memcpy(c->out + c->out_len, "\r\n", 2);
    c->out_len += 2;
}

/* Builds the next batch: sets first, then all the gets as one multi-get. */
static void build_batch(struct thread *t, struct conn *c)
{
    c->out_len = c->out_sent = 0;
    c->nsets = c->ngets = 0;
    for (int i = 0; i < opt.batch; i++) {
        long k = pick_key(&t->rng);
        if ((int)(rng_next(&t->rng) % 100) < opt.set_pct) {
            append_set(t, c, k);
            c->nsets++;
        } else {
            c->get_keys[c->ngets++] = k;
        }
    }
    if (c->ngets > 0) {
        out_need(c, 8 + (size_t)c->ngets * (KEY_MAX + 1));
        memcpy(c->out + c->out_len, "get", 3);
        c->out_len += 3;
        for (int i = 0; i < c->ngets; i++) {
            c->out[c->out_len++] = ' ';
            c->out_len += (size_t)key_name(c->out + c->out_len, c->get_keys[i]);
        }
        memcpy(c->out + c->out_len, "\r\n", 2);
        c->out_len += 2;
    }
    c->sets_left = c->nsets;
    c->get_pending = c->ngets > 0;
    c->get_seen = 0;
    c->sent_at = now_ns();
}

/* Populating: a batch of sets over [from, to). */
static void build_populate(struct thread *t, struct conn *c, long *next)
{
    c->out_len = c->out_sent = 0;
    c->nsets = c->ngets = 0;
    while (c->nsets < opt.batch && *next < t->populate_to) {
        append_set(t, c, (*next)++);
        c->nsets++;
    }
    c->sets_left = c->nsets;
    c->get_pending = false;
    c->sent_at = now_ns();
}

/* Parses what has arrived. Returns 1 when the batch is complete, 0 when
 * more is needed, -1 on a protocol error (the connection is then dropped). */
static int parse_replies(struct thread *t, struct conn *c, bool measure)
{
    size_t pos = 0;
    int result = 0;
    uint64_t now = now_ns();
    for (;;) {
        if (c->sets_left == 0 && !c->get_pending) {
            result = 1;
            break;
        }
        char *line = c->in + pos;
        char *nl = memchr(line, '\n', c->in_len - pos);
        if (nl == NULL)
            break;
        size_t llen = (size_t)(nl - line) + 1;
        if (c->sets_left > 0) {
            if (llen != 8 || memcmp(line, "STORED\r\n", 8) != 0) {
                t->n.errors++;
                if (!opt.quiet && t->n.errors <= 3)
                    fprintf(stderr, "kvload: set failed: %.*s\n", (int)(llen - 2 > 200 ? 200 : llen - 2), line);
            }
            if (measure) {
                t->n.ops++;
                t->n.sets++;
                hist_add(&t->hist, now - c->sent_at);
            }
            c->sets_left--;
            pos += llen;
            continue;
        }
        if (llen == 5 && memcmp(line, "END\r\n", 5) == 0) {
            /* the gets not answered by a VALUE were misses */
            int missed = c->ngets - c->get_seen;
            t->n.gets += (uint64_t)missed;
            t->n.misses += (uint64_t)missed;
            if (measure) {
                t->n.ops += (uint64_t)missed;
                for (int i = 0; i < missed; i++)
                    hist_add(&t->hist, now - c->sent_at);
            }
            c->get_pending = false;
            pos += llen;
            continue;
        }
        if (llen > 6 && memcmp(line, "VALUE ", 6) == 0) {
            char *key = line + 6, *sp = memchr(key, ' ', llen - 6);
            if (sp == NULL)
                return -1;
            size_t nkey = (size_t)(sp - key);
            unsigned long flags;
            long bytes;
            if (sscanf(sp, " %lu %ld", &flags, &bytes) != 2 || bytes < 0)
                return -1;
            if (c->in_len - pos < llen + (size_t)bytes + 2)
                break; /* the value has not fully arrived */
            const char *val = line + llen;
            if (opt.verify && !check_value(val, (size_t)bytes, key, nkey)) {
                t->n.mismatches++;
                if (!opt.quiet && t->n.mismatches <= 3)
                    fprintf(stderr, "kvload: verify mismatch for key %.*s (%ld bytes)\n", (int)nkey, key, bytes);
            }
            t->n.gets++;
            t->n.hits++;
            if (measure) {
                t->n.ops++;
                hist_add(&t->hist, now - c->sent_at);
            }
            c->get_seen++;
            pos += llen + (size_t)bytes + 2;
            continue;
        }
        t->n.errors++;
        if (!opt.quiet && t->n.errors <= 3)
            fprintf(stderr, "kvload: unexpected reply: %.*s\n", (int)(llen > 200 ? 200 : llen), line);
        return -1;
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
    return result;
}

static bool finished(struct conn *c)
{
    if (stop_flag)
        return true;
    if (run_deadline && now_ns() >= run_deadline)
        return true;
    return opt.num_cycles >= 0 && c->cycles >= opt.num_cycles;
}

/* Drives the thread's connections until every one is done. populate: one
 * pass of sets over the thread's share of the keys instead of the run. */
static void drive(struct thread *t, bool populate)
{
    int ep = epoll_create1(EPOLL_CLOEXEC);
    long next_key = t->populate_from;
    int active = 0;
    for (int i = 0; i < opt.connections; i++) {
        struct conn *c = &t->conns[i];
        c->done = false;
        c->cycles = 0;
        c->in_len = 0;
        if (populate) {
            if (next_key >= t->populate_to) {
                c->done = true;
                continue;
            }
            build_populate(t, c, &next_key);
        } else {
            if (finished(c)) {
                c->done = true;
                continue;
            }
            build_batch(t, c);
        }
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
        active++;
    }
    struct epoll_event events[64];
    while (active > 0) {
        int n = epoll_wait(ep, events, 64, 200);
        if (n < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            if (c->done)
                continue;
            if ((events[i].events & EPOLLOUT) && c->out_sent < c->out_len) {
                ssize_t w = send(c->fd, c->out + c->out_sent, c->out_len - c->out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (w < 0 && errno != EAGAIN && errno != EINTR)
                    goto conn_failed;
                if (w > 0)
                    c->out_sent += (size_t)w;
                if (c->out_sent == c->out_len) {
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                }
            }
            if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
                if (c->in_cap - c->in_len < 65536) {
                    c->in_cap = c->in_cap ? c->in_cap * 2 : 262144;
                    c->in = realloc(c->in, c->in_cap);
                    if (c->in == NULL) {
                        fprintf(stderr, "kvload: out of memory\n");
                        exit(1);
                    }
                }
                ssize_t r = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                    goto conn_failed;
                if (r > 0)
                    c->in_len += (size_t)r;
                int done = parse_replies(t, c, !populate);
                if (done < 0)
                    goto conn_failed;
                if (done == 1) {
                    c->cycles++;
                    if (populate ? next_key >= t->populate_to : finished(c)) {
                        c->done = true;
                        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                        active--;
                        continue;
                    }
                    if (populate)
                        build_populate(t, c, &next_key);
                    else
                        build_batch(t, c);
                    /* Send the next batch at once: waiting for EPOLLOUT first
                     * costs two epoll_ctl calls and a wake-up per batch, which
                     * made unbatched kvload slower than memcaslap (docs/bench.md).
                     * Only a full socket buffer waits for writability. */
                    ssize_t w = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);
                    if (w < 0 && errno != EAGAIN && errno != EINTR)
                        goto conn_failed;
                    if (w > 0)
                        c->out_sent = (size_t)w;
                    if (c->out_sent < c->out_len) {
                        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
                        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                    }
                }
                __atomic_store_n(&progress_ops[t->idx], t->n.ops, __ATOMIC_RELAXED);
            }
            continue;
        conn_failed:
            t->n.errors++;
            if (!opt.quiet)
                fprintf(stderr, "kvload: connection lost (%s)\n", errno ? strerror(errno) : "closed by server");
            c->done = true;
            epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
            active--;
        }
    }
    close(ep);
}

/* ---- threads and the run ------------------------------------------------------ */

static pthread_barrier_t populated, started;

static void *thread_main(void *arg)
{
    struct thread *t = arg;
    if (opt.ncpus > 0) {
        char who[32];
        snprintf(who, sizeof(who), "thread %d", t->idx);
        cpulist_pin_self(opt.cpus[t->idx % opt.ncpus], "kvload", who);
    }
    for (int i = 0; i < opt.connections; i++) {
        t->conns[i].fd = connect_server();
        if (t->conns[i].fd < 0)
            t->connect_failed = 1;
    }
    pthread_barrier_wait(&started); /* main checks connect_failed here */
    pthread_barrier_wait(&started);
    if (stop_flag)
        return NULL;
    if (!opt.no_population)
        drive(t, true);
    pthread_barrier_wait(&populated); /* main starts the clock */
    pthread_barrier_wait(&populated);
    if (!opt.populate_only)
        drive(t, false);
    return NULL;
}

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    if (opt.zipf_s > 0)
        zipf_setup();

    struct thread *threads = calloc((size_t)opt.threads, sizeof(*threads));
    pthread_barrier_init(&started, NULL, (unsigned)opt.threads + 1);
    pthread_barrier_init(&populated, NULL, (unsigned)opt.threads + 1);
    long share = (opt.num_items + opt.threads - 1) / opt.threads;
    for (int i = 0; i < opt.threads; i++) {
        struct thread *t = &threads[i];
        t->idx = i;
        t->rng = (opt.seed + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)i + 1) * 0xBF58476D1CE4E5B9ull;
        if (t->rng == 0)
            t->rng = 1;
        t->populate_from = i * share < opt.num_items ? i * share : opt.num_items;
        t->populate_to = (i + 1) * share < opt.num_items ? (i + 1) * share : opt.num_items;
        t->conns = calloc((size_t)opt.connections, sizeof(struct conn));
        for (int j = 0; j < opt.connections; j++)
            t->conns[j].get_keys = calloc((size_t)opt.batch, sizeof(long));
        pthread_create(&t->tid, NULL, thread_main, t);
    }
    pthread_barrier_wait(&started);
    int failed = 0;
    for (int i = 0; i < opt.threads; i++)
        failed |= threads[i].connect_failed;
    if (failed) {
        fprintf(stderr, "kvload: cannot connect to %s:%s: is the server running there?\n", opt.host, opt.port);
        stop_flag = 1;
    }
    pthread_barrier_wait(&started);
    if (failed) { /* the threads saw stop_flag and returned */
        for (int i = 0; i < opt.threads; i++)
            pthread_join(threads[i].tid, NULL);
        return 2;
    }

    uint64_t pop_start = now_ns();
    pthread_barrier_wait(&populated);
    uint64_t t0 = now_ns();
    if (!opt.no_population && !opt.quiet && !opt.json)
        fprintf(stderr, "kvload: populated %ld keys in %.2f s\n", opt.num_items, (double)(t0 - pop_start) / 1e9);
    if (opt.duration > 0)
        run_deadline = t0 + (uint64_t)(opt.duration * 1e9);
    pthread_barrier_wait(&populated);

    /* progress once a second on a terminal, while the threads run */
    bool show = !opt.quiet && !opt.populate_only && isatty(STDERR_FILENO);
    bool *joined = calloc((size_t)opt.threads, sizeof(bool));
    uint64_t last_ops = 0, last_t = t0;
    for (int running = 1; running && show;) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        running = 0;
        for (int i = 0; i < opt.threads; i++) {
            if (!joined[i])
                joined[i] = pthread_tryjoin_np(threads[i].tid, NULL) == 0;
            running |= !joined[i];
        }
        uint64_t now = now_ns();
        if (now - last_t >= 1000000000ull) {
            uint64_t ops = 0;
            for (int i = 0; i < opt.threads; i++)
                ops += __atomic_load_n(&progress_ops[i], __ATOMIC_RELAXED);
            fprintf(stderr, "kvload: %5.1f s  %10.0f ops/s\n", (double)(now - t0) / 1e9,
                    (double)(ops - last_ops) / ((double)(now - last_t) / 1e9));
            last_ops = ops;
            last_t = now;
        }
        if (!running)
            break;
    }
    for (int i = 0; i < opt.threads; i++)
        if (!joined[i])
            pthread_join(threads[i].tid, NULL);
    free(joined);
    double secs = (double)(now_ns() - t0) / 1e9;

    struct counters n = {0};
    static struct hist all;
    for (int i = 0; i < opt.threads; i++) {
        struct thread *t = &threads[i];
        n.ops += t->n.ops;
        n.gets += t->n.gets;
        n.sets += t->n.sets;
        n.hits += t->n.hits;
        n.misses += t->n.misses;
        n.errors += t->n.errors;
        n.mismatches += t->n.mismatches;
        for (unsigned b = 0; b < HBUCKETS; b++)
            all.count[b] += t->hist.count[b];
        if (t->hist.max > all.max)
            all.max = t->hist.max;
        for (int j = 0; j < opt.connections; j++) {
            close(t->conns[j].fd);
            free(t->conns[j].out);
            free(t->conns[j].in);
            free(t->conns[j].get_keys);
        }
        free(t->conns);
    }
    double ops_s = secs > 0 ? (double)n.ops / secs : 0;
    double p50 = (double)hist_pct(&all, 0.50) / 1e3, p99 = (double)hist_pct(&all, 0.99) / 1e3;
    double p999 = (double)hist_pct(&all, 0.999) / 1e3, pmax = (double)all.max / 1e3;

    if (!opt.populate_only) {
        FILE *out = opt.json ? stderr : stdout;
        if (!opt.quiet || !opt.json) {
            fprintf(out, "kvload: %s:%s  %d thread(s) x %d conn(s), batch %d, %d%% sets, %ld keys\n", opt.host,
                    opt.port, opt.threads, opt.connections, opt.batch, opt.set_pct, opt.num_items);
            fprintf(out, "  ops %llu in %.2f s = %.0f ops/s   gets %llu (hits %llu, misses %llu)   sets %llu\n",
                    (unsigned long long)n.ops, secs, ops_s, (unsigned long long)n.gets, (unsigned long long)n.hits,
                    (unsigned long long)n.misses, (unsigned long long)n.sets);
            fprintf(out, "  latency us  p50 %.1f  p99 %.1f  p99.9 %.1f  max %.1f   errors %llu   verify mismatches %llu\n",
                    p50, p99, p999, pmax, (unsigned long long)n.errors, (unsigned long long)n.mismatches);
        }
        if (opt.json)
            printf("{\"ops\": %llu, \"ops_per_sec\": %.1f, \"gets\": %llu, \"sets\": %llu, \"hits\": %llu, "
                   "\"misses\": %llu, \"errors\": %llu, \"verify_mismatches\": %llu, \"duration_s\": %.3f, "
                   "\"latency_us\": {\"p50\": %.1f, \"p99\": %.1f, \"p999\": %.1f, \"max\": %.1f}, "
                   "\"threads\": %d, \"connections\": %d, \"batch_size\": %d, \"set_pct\": %d, "
                   "\"num_items\": %ld, \"verify\": %s}\n",
                   (unsigned long long)n.ops, ops_s, (unsigned long long)n.gets, (unsigned long long)n.sets,
                   (unsigned long long)n.hits, (unsigned long long)n.misses, (unsigned long long)n.errors,
                   (unsigned long long)n.mismatches, secs, p50, p99, p999, pmax, opt.threads, opt.connections,
                   opt.batch, opt.set_pct, opt.num_items, opt.verify ? "true" : "false");
    } else if (!opt.json) {
        printf("kvload: populated %ld keys, %llu errors\n", opt.num_items, (unsigned long long)n.errors);
    } else {
        printf("{\"populated\": %ld, \"errors\": %llu}\n", opt.num_items, (unsigned long long)n.errors);
    }
    free(threads);
    free(zipf_cdf);
    return (n.errors || n.mismatches) ? 1 : 0;
}
