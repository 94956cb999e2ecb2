// Hits per USDT probe, for `kvprof probes`: handler on_hit_<i> is attached
// to every site of the i-th probe and counts into slot i of a per-CPU array
// (per-CPU, so counting adds no shared cache line to the target's hot path).
// The uprobes are attached with the target's PID; the tgid check below also
// keeps out a child that shares the executable's pages.
// Flags: those of common.h, and -DUSDT_RATE_PROBES=<n> (handlers below: 64).
#include "common.h"

BPF_PERCPU_ARRAY(hits, u64, USDT_RATE_PROBES);

static __always_inline int hit(int i)
{
    if (kv_is_target(bpf_get_current_pid_tgid()))
        kv_add_percpu(hits.lookup(&i), 1);
    return 0;
}

#define HIT(i) \
    int on_hit_##i(struct pt_regs *ctx) { return hit(i); }
HIT(0) HIT(1) HIT(2) HIT(3) HIT(4) HIT(5) HIT(6) HIT(7)
HIT(8) HIT(9) HIT(10) HIT(11) HIT(12) HIT(13) HIT(14) HIT(15)
HIT(16) HIT(17) HIT(18) HIT(19) HIT(20) HIT(21) HIT(22) HIT(23)
HIT(24) HIT(25) HIT(26) HIT(27) HIT(28) HIT(29) HIT(30) HIT(31)
HIT(32) HIT(33) HIT(34) HIT(35) HIT(36) HIT(37) HIT(38) HIT(39)
HIT(40) HIT(41) HIT(42) HIT(43) HIT(44) HIT(45) HIT(46) HIT(47)
HIT(48) HIT(49) HIT(50) HIT(51) HIT(52) HIT(53) HIT(54) HIT(55)
HIT(56) HIT(57) HIT(58) HIT(59) HIT(60) HIT(61) HIT(62) HIT(63)
