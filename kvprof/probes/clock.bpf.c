// One cpu-clock event per CPU for every sampler of a module.
//
// Each timer interrupt of a sampling event costs the target far more than the
// programs that run at it, measured on a KVM guest (docs/overhead-log.md, "One
// clock for the samplers"; why is not known), so oncpu and
// regsample do not open one event each: kvprof/collect/bpf.py (CpuClock)
// attaches kv_cpu_clock alone, at the on-CPU rate, and it runs the sampler
// functions of the collectors compiled into the module. Flags:
//   -DKV_CLOCK_SAMPLERS=<n>         slots in kv_clock_on
//   -DKV_CLOCK_<NAME>=<slot>        for each sampler in the module: its slot
// A sampler runs while its slot in kv_clock_on is 1 (its collector attached
// and not paused).

#ifndef KV_CLOCK_SAMPLERS
#error "compile with -DKV_CLOCK_SAMPLERS=<n> and a -DKV_CLOCK_<NAME>=<slot> per sampler"
#endif

BPF_ARRAY(kv_clock_on, u32, KV_CLOCK_SAMPLERS);

static __always_inline int kv_clock_runs(int slot)
{
    u32 *on = kv_clock_on.lookup(&slot);
    return on && *on;
}

int kv_cpu_clock(struct kv_perf_event_data *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!kv_is_target(id))
        return 0;
    u64 ustack = 0;  // the user stack oncpu took at this sample: regsample keeps it with the registers
#ifdef KV_CLOCK_ONCPU
    if (kv_clock_runs(KV_CLOCK_ONCPU))
        ustack = oncpu_sample(ctx, id);
#endif
#ifdef KV_CLOCK_REGSAMPLE
    if (kv_clock_runs(KV_CLOCK_REGSAMPLE))
        regsample_sample(ctx, id, ustack);
#endif
    return 0;
}
