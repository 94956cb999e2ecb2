// User-stack unwinding in BPF from compact unwind tables, for code with or
// without frame pointers. Included by oncpu.bpf.c and offcpu.bpf.c; the
// tables are built and pushed by kvprof/collect/unwind.py:
//
//   unw_rows      rows of every module, each module's rows contiguous and
//                 sorted by pc: "from pc on, CFA = rsp+n | rbp+n, rbp saved at
//                 CFA+k (k=0: not saved), return address at CFA-8", built from
//                 .eh_frame / .debug_frame (x86_64)
//   unw_pages     every 4 KiB page of the target's executable mappings ->
//                 its module's load bias and the range of rows that cover the
//                 page (the row in effect at its start, then the ones inside),
//                 so a frame costs one hash lookup and a 12-step binary search
//
// A page whose module has no unwind information at all is walked by frame
// pointers. The walk stops at the outermost frame (return address undefined
// in the CFI: _start, clone3), at a pc no table covers, at a failed stack
// read, or after UNWIND_FRAMES frames; the reason is kept with the stack.
// Only user memory (bpf_probe_read_user) and the user pt_regs that the ABI
// fixes are read: no kernel struct is dereferenced.
//
// Stacks are stored by a 64-bit hash of their ips (and reason) in `ustacks`;
// the aggregation maps key on that hash, like a stack id.

#ifndef KVPROF_UNWIND_H  // oncpu and offcpu both include it in one module
#define KVPROF_UNWIND_H

// The loader passes the bounds (kvprof/collect/unwind.py: cflags()):
//   -DUNWIND_ROWS=<n> -DUNWIND_PAGES=<n> -DUNWIND_FRAMES=<n, a power of two> -DUNWIND_STACKS=<n>
#if !defined(UNWIND_ROWS) || !defined(UNWIND_PAGES) || !defined(UNWIND_FRAMES) || !defined(UNWIND_STACKS)
#error "compile with the -DUNWIND_* bounds of kvprof/collect/unwind.py"
#endif
#define UNWIND_PAGE_SHIFT 12
#define UNWIND_ROW_STEPS 12  // rows of one page (distinct pcs): at most 4096 = 2^12

// unw_row.kind; the order of ROW_KINDS in kvprof/collect/unwind.py.
enum unw_kind {
    UK_NONE,  // no unwind information from this pc on (a gap between functions)
    UK_RSP,   // CFA = rsp + cfa_off
    UK_RBP,   // CFA = rbp + cfa_off
    UK_END,   // return address undefined: the outermost frame
    UK_PLT,   // a PLT entry: CFA = rsp + 8, + 8 more past its push (pc & 15 >= 11)
};

// ustack_t.reason; the order of STOP_REASONS in kvprof/collect/unwind.py.
enum unw_reason {
    UR_ROOT,        // reached the outermost frame
    UR_NO_INFO,     // a pc that no table covers (or a frame-pointer walk that ended in 0)
    UR_NO_MAPPING,  // a pc outside every executable page pushed (JIT code, a late dlopen, too many)
    UR_READ,        // the stack could not be read (not resident, or garbage registers)
    UR_DEPTH,       // UNWIND_FRAMES frames and not at the root yet
    UR_NO_TABLE,    // the module's table did not fit in unw_rows
};

struct unw_row {
    u32 pc;  // module-relative (ELF virtual address)
    u8 kind;
    u8 pad;
    s16 rbp_off;  // rbp saved at CFA + rbp_off; 0: rbp keeps its value
    s32 cfa_off;
};

// unw_page.flags
#define UNW_PAGE_FP 1        // no unwind information: walk frame pointers
#define UNW_PAGE_NO_TABLE 2  // the module's rows did not fit in unw_rows

struct unw_page {
    u64 bias;  // runtime address - module-relative pc
    u32 row_start;
    u16 row_count;
    u16 flags;
};

struct ustack_t {
    u64 ips[UNWIND_FRAMES];
    u32 len;
    u32 reason;
};

struct unw_regs {
    u64 ip;
    u64 sp;
    u64 bp;
};

BPF_ARRAY(unw_rows, struct unw_row, UNWIND_ROWS);
BPF_HASH(unw_pages, u64, struct unw_page, UNWIND_PAGES);
BPF_ARRAY(unw_ready, u32, 1);  // set once the loader has pushed the tables
BPF_HASH(ustacks, u64, struct ustack_t, UNWIND_STACKS);
BPF_PERCPU_ARRAY(unw_scratch, struct ustack_t, 1);

// Events that come before the tables are in (BCC attaches tracepoints while
// loading) are skipped: their stacks would stop at the first frame.
static __always_inline int unw_tables_ready(void)
{
    int zero = 0;
    u32 *ready = unw_ready.lookup(&zero);
    return ready && *ready;
}

// The user registers of the current task: the sample's own registers when it
// interrupted user mode (`ctx_regs`, a perf-event context's, read field by
// field: the verifier rewrites those loads), else the pt_regs saved at its
// entry to the kernel.
static __always_inline int unw_user_regs(struct pt_regs *ctx_regs, struct unw_regs *out)
{
    if (ctx_regs && (ctx_regs->cs & 3) == 3) {
        out->ip = ctx_regs->ip;
        out->sp = ctx_regs->sp;
        out->bp = ctx_regs->bp;
        return 0;
    }
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    struct pt_regs r = {};
    if (bpf_probe_read_kernel(&r, sizeof(r), regs))
        return -1;
    out->ip = r.ip;
    out->sp = r.sp;
    out->bp = r.bp;
    return 0;
}

// Binary searches run a fixed number of steps without branches (a branch per
// step would multiply the paths the verifier walks): `below` is 1 when the
// probed entry starts past the searched value, and moves `hi` down, else `lo` up.
// (Module-relative pcs are below 2^32, so the subtraction's sign bit is the comparison.)
#define UNW_STEP(lo, hi, start_of_mid, value)                          \
    do {                                                               \
        u64 below = ((u64)(value) - (u64)(start_of_mid)) >> 63;        \
        lo = lo + (mid - lo) * (1 - below);                            \
        hi = hi - (hi - mid) * below;                                  \
    } while (0)

// The row that covers pc in [start, start + count), or 0.
static __always_inline struct unw_row *unw_find_row(u32 start, u32 count, u32 pc)
{
    u32 lo = start, hi = start + count;
#pragma clang loop unroll(disable)
    for (int i = 0; i < UNWIND_ROW_STEPS; i++) {
        u32 mid = lo + (hi - lo) / 2;
        struct unw_row *r = unw_rows.lookup(&mid);
        if (!r)
            return 0;
        UNW_STEP(lo, hi, r->pc, pc);
    }
    struct unw_row *r = unw_rows.lookup(&lo);
    if (!r || r->pc > pc)
        return 0;
    return r;
}

// Unwind the current task's user stack from `regs` into the stack map;
// returns the stack's key, or 0 when there is no user stack or `ustacks` is full.
static __always_inline u64 unw_stack(struct unw_regs *regs)
{
    int zero = 0;
    struct ustack_t *st = unw_scratch.lookup(&zero);
    if (!st || !regs->ip)
        return 0;
    u64 ip = regs->ip, sp = regs->sp, bp = regs->bp;
    u64 hash = 14695981039346656037ULL;
    u32 reason = UR_DEPTH;
    u32 n = 0;
#pragma clang loop unroll(disable)
    for (int i = 0; i < UNWIND_FRAMES; i++) {
        st->ips[i & (UNWIND_FRAMES - 1)] = ip;
        n = i + 1;
        hash = (hash ^ ip) * 1099511628211ULL;
        u64 page_no = ip >> UNWIND_PAGE_SHIFT;
        struct unw_page *pg = unw_pages.lookup(&page_no);
        if (!pg) {
            reason = UR_NO_MAPPING;
            break;
        }
        u64 cfa, ra = 0;
        if (pg->flags & UNW_PAGE_NO_TABLE) {
            reason = UR_NO_TABLE;
            break;
        }
        if (pg->flags & UNW_PAGE_FP) {
            // Frame pointers: [rbp] = caller's rbp, [rbp + 8] = return address.
            if (!bp) {
                reason = UR_NO_INFO;
                break;
            }
            cfa = bp + 16;
            if (bpf_probe_read_user(&bp, sizeof(bp), (void *)(cfa - 16))) {
                reason = UR_READ;
                break;
            }
        } else {
            if (!pg->row_count) {
                reason = UR_NO_INFO;
                break;
            }
            // A return address points after its call: look up the call itself.
            u32 pc = (u32)(ip - pg->bias) - (i > 0 ? 1 : 0);
            struct unw_row *r = unw_find_row(pg->row_start, pg->row_count, pc);
            if (!r || r->kind == UK_NONE) {
                reason = UR_NO_INFO;
                break;
            }
            if (r->kind == UK_END) {
                reason = UR_ROOT;
                break;
            }
            if (r->kind == UK_RBP)
                cfa = bp + r->cfa_off;
            else if (r->kind == UK_PLT)
                cfa = sp + 8 + ((ip & 15) >= 11 ? 8 : 0);
            else
                cfa = sp + r->cfa_off;
            if (r->rbp_off && bpf_probe_read_user(&bp, sizeof(bp), (void *)(cfa + r->rbp_off))) {
                reason = UR_READ;
                break;
            }
        }
        if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8))) {
            reason = UR_READ;
            break;
        }
        if (!ra) {  // some outermost frames end in a zero return address instead of CFI
            reason = UR_ROOT;
            break;
        }
        ip = ra;
        sp = cfa;
    }
    st->len = n;
    st->reason = reason;
    hash = (hash ^ reason) * 1099511628211ULL;
    if (!hash)
        hash = 1;
    // Frames past len are left from earlier stacks: the loader reads len only.
    if (!ustacks.lookup(&hash)) {
        int err = ustacks.insert(&hash, st);
        if (err && err != -17)  // -EEXIST: another CPU stored the same stack meanwhile
            return 0;           // ustacks is full
    }
    return hash;
}

#endif
