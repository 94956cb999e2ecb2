/*
 * loop: the target's TCP connections as a closed loop, from the tcp:tcp_probe
 * tracepoint (a segment with data arriving on an established socket). On one
 * connection, a request's first segment arriving at one of the target's
 * listening ports starts its time in the server (queued, then served); the
 * answer's segments arriving at the client's end (seen only when the client
 * runs on this machine) end it, the last one before the next request; from
 * there to the next request is the client's time (and the network's).
 *
 * Per connection (its ports and the client's address) the state of the
 * exchange; in per-CPU counters, the exchanges completed and their two times.
 * On loopback a segment arrives in the sender's context: the threads that sent
 * requests are the client's (loop_senders), counted when the answer is seen.
 * Only the tracepoint's own fields are read (ports, length, addresses). Python
 * attaches it in stretches and sets loop_on for the seconds it counts.
 *
 * Flags: those of common.h, and -DLOOP_PORTS=p1,p2,... (the target's listening
 * TCP ports, at most 8) and -DLOOP_NPORTS=n.
 */
#include "common.h"

#if !defined(LOOP_PORTS) || !defined(LOOP_NPORTS)
#error "compile with -DLOOP_PORTS and -DLOOP_NPORTS (kvprof/collect/loop.py)"
#endif

struct loop_key {
    u32 client_addr;  // the client's IPv4 address, or the last 4 bytes of its IPv6 one
    u16 port;  // the target's
    u16 client_port;
};

struct loop_conn {
    u64 start;  // the request's first segment arrived at the target
    u64 answered;  // the last segment of the answer seen so far arrived at the client
    u32 state;  // LOOP_IDLE, LOOP_IN_SERVER, LOOP_ANSWERED
    u32 sender;  // the thread that sent the request (loopback: the client's)
};

enum loop_state { LOOP_IDLE, LOOP_IN_SERVER, LOOP_ANSWERED };
// exchanges: requests answered then followed by the next one; server_ns, client_ns: their
// two times summed; requests: request segments that started one; map_full
enum loop_counter { LOOP_EXCHANGES, LOOP_SERVER_NS, LOOP_CLIENT_NS, LOOP_REQUESTS, LOOP_MAP_FULL, LOOP_COUNTERS };

BPF_HASH(loop_conns, struct loop_key, struct loop_conn, MAX_ENTRIES);
BPF_HASH(loop_senders, u32, u64, 1024);  // thread -> exchanges it started
BPF_PERCPU_ARRAY(loop_counters, u64, LOOP_COUNTERS);  // per CPU: no line of ours bounces
BPF_ARRAY(loop_on, u32, 1);  // 1 while a stretch counts (set after attaching, cleared before detaching)

static __always_inline void loop_count(int which, u64 n)
{
    kv_add_percpu(loop_counters.lookup(&which), n);
}

static __always_inline int loop_port(u16 port)
{
    u16 ports[LOOP_NPORTS] = {LOOP_PORTS};
#pragma unroll
    for (int i = 0; i < LOOP_NPORTS; i++)
        if (ports[i] == port)
            return 1;
    return 0;
}

// The 4 bytes of an address in the tracepoint's sockaddr blob that tell hosts apart:
// sin_addr (offset 4) for IPv4, the last 4 bytes of sin6_addr (offset 20) for IPv6.
static __always_inline u32 loop_addr(const u8 *sa, u16 family)
{
    u32 a = 0;
    bpf_probe_read_kernel(&a, sizeof(a), sa + (family == 10 ? 20 : 4));
    return a;
}

TRACEPOINT_PROBE(tcp, tcp_probe)
{
    u32 *on = loop_on.lookup(KV_IDX(0));
    if (!on || !*on || args->data_len == 0)
        return 0;
    u64 now = bpf_ktime_get_ns();
    struct loop_key k = {};
    int request;
    if (loop_port(args->sport)) {  // arriving at the target's socket: a request
        request = 1;
        k.port = args->sport;
        k.client_port = args->dport;
        k.client_addr = loop_addr(args->daddr, args->family);
    } else if (loop_port(args->dport)) {  // arriving at the client's socket: an answer
        request = 0;
        k.port = args->dport;
        k.client_port = args->sport;
        k.client_addr = loop_addr(args->saddr, args->family);
    } else {
        return 0;
    }
    struct loop_conn fresh = {};
    struct loop_conn *c = loop_conns.lookup_or_try_init(&k, &fresh);
    if (!c) {
        loop_count(LOOP_MAP_FULL, 1);
        return 0;
    }
    if (!request) {
        if (c->state != LOOP_IDLE) {
            c->answered = now;
            c->state = LOOP_ANSWERED;
        }
        return 0;
    }
    if (c->state == LOOP_ANSWERED) {
        loop_count(LOOP_EXCHANGES, 1);
        loop_count(LOOP_SERVER_NS, c->answered - c->start);
        loop_count(LOOP_CLIENT_NS, now - c->answered);
        u64 one = 0;
        kv_add(loop_senders.lookup_or_try_init(&c->sender, &one), 1);
    }
    if (c->state != LOOP_IN_SERVER) {
        c->start = now;
        c->state = LOOP_IN_SERVER;
        c->sender = (u32)bpf_get_current_pid_tgid();
        loop_count(LOOP_REQUESTS, 1);
    }
    return 0;
}
