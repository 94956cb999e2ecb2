#!/bin/bash
# PID 1 of the two-socket guest that scripts/vm-test.sh boots (it is started
# by scripts/vm-initrd-init.sh from the payload unpacked into /opt/kvprof).
#
# Runs kvcached --preset baseline with 4 workers pinned two per socket, drives
# it with kvload, records it with `kvprof record --collectors cachelines` (then
# 3 s of on-CPU and off-CPU stacks into stacks.json), and writes /out
# (profile.json plus logs) as a tar onto the third disk, which the host reads
# back. Lines starting with VMTEST go to the serial console, where
# the host prints them. Settings come from /opt/kvprof/vm.env (written by
# vm-test.sh). The guest powers itself off at the end, whatever happened.
set -euo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=/opt/kvprof
K=/opt/kvprof
OUT=/out
PROBE_SAMPLE=4
RECORD_SECONDS=8
PORT=11211
# shellcheck source=/dev/null
[[ -r $K/vm.env ]] && . "$K/vm.env"

T0=$EPOCHREALTIME
say() { printf 'VMTEST %s\n' "$*"; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}'; }

SERVER=
LOAD=
finish() {
    local rc=$?
    set +e
    [[ -n $LOAD ]] && kill "$LOAD" 2>/dev/null
    [[ -n $SERVER ]] && kill "$SERVER" 2>/dev/null
    # These two only: a recording show_hang() gave up on may never end.
    # shellcheck disable=SC2086 # either may be empty
    wait $LOAD $SERVER 2>/dev/null
    echo "$rc" >"$OUT/exit-status"
    # The host finds the output as a tar at the start of the third disk.
    if tar -c -f /dev/vdc -C "$OUT" .; then
        say "wrote $(du -sk "$OUT" | cut -f1) KiB of output to /dev/vdc"
    else
        say "could not write the output to /dev/vdc"
    fi
    sync
    say "guest done in $(elapsed "$T0") s (exit $rc); powering off"
    echo o >/proc/sysrq-trigger
    sleep 60
}
trap finish EXIT

die() {
    say "error: $*"
    exit 1
}

# Each thread of a process: name, state, and where it sleeps in the kernel.
threads_of() {
    local t
    for t in /proc/"$1"/task/*; do
        printf '%s %s %s; ' "$(cat "$t/comm")" "$(awk '{print $3}' "$t/stat")" "$(cat "$t/wchan")"
    done
}

# How long a recording may take to attach, and to end once attached, before the
# guest says where it hangs and fails. Both leave the host's GUEST_TIMEOUT room
# for two recordings, so a hang is named here instead of ending in QEMU's timeout.
ATTACH_LIMIT=90
END_LIMIT=60

# Says where the threads of $1 (a recording) wait, in the kernel, and what it
# last wrote (its log, $2); kills it. No Python stacks: a recording died of
# SIGSEGV here just after faulthandler's timed dump (which reads the frames of
# threads that run), and a dump on a signal did not come out while BCC compiled.
show_hang() {
    local pid=$1 log=$2 t
    say "threads: $(threads_of "$pid")"
    for t in /proc/"$pid"/task/*; do
        say "kernel stack of ${t##*/}: $(tr '\n' ' ' 2>/dev/null <"$t/stack")"
    done
    kill -KILL "$pid" 2>/dev/null || true
    while IFS= read -r line; do say "log: $line"; done < <(tail -n 10 "$log")
}

# Waits until $3 (a command) succeeds, for at most ATTACH_LIMIT s, while the
# recording $1 (log $2) runs; a recording that exits first is left to its wait.
wait_attached() {
    local pid=$1 log=$2 deadline=$((EPOCHSECONDS + ATTACH_LIMIT))
    shift 2
    while ! "$@"; do
        kill -0 "$pid" 2>/dev/null || return 0
        if ((EPOCHSECONDS >= deadline)); then
            show_hang "$pid" "$log"
            die "the recording did not attach within $ATTACH_LIMIT s"
        fi
        sleep 0.5
    done
}

# The exit status of the recording $1 (log $2), which has attached: it ends
# within its duration; past END_LIMIT s more, where it hangs is shown and the
# guest fails.
wait_recorded() {
    local pid=$1 log=$2 seconds=$3 rc=0 deadline
    deadline=$((EPOCHSECONDS + seconds + END_LIMIT))
    while kill -0 "$pid" 2>/dev/null && ((EPOCHSECONDS < deadline)); do sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
        show_hang "$pid" "$log"
        die "the recording did not end within $END_LIMIT s of its $seconds s"
    fi
    wait "$pid" || rc=$?
    return "$rc"
}

# Whether the recording $1 holds perf event fds (its uprobes on the kvs probes):
# the kernel's word that it attached, not a message of record's.
holds_perf_events() {
    find "/proc/$1/fd" -lname 'anon_inode:*perf_event*' 2>/dev/null | grep -q .
}

# kvload stops a connection once its batch is answered: stop it, and say why
# when it does not stop (a batch the server never answered) instead of letting
# the guest run into the host's timeout.
stop_load() {
    kill "$LOAD" 2>/dev/null
    for _ in $(seq 200); do
        kill -0 "$LOAD" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$LOAD" 2>/dev/null; then
        say "kvload threads: $(threads_of "$LOAD")"
        say "kvcached threads: $(threads_of "$SERVER")"
        die "kvload did not stop within 20 s of SIGTERM: a batch was not answered (kvcached's log: $(tail -n 3 "$OUT/kvcached.log"))"
    fi
    wait "$LOAD" 2>/dev/null || true
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t tmpfs tmpfs /tmp
# devtmpfs has no /dev/fd (udev makes it elsewhere); bash's <(...) needs it.
[[ -e /dev/fd ]] || ln -s /proc/self/fd /dev/fd
mkdir -p "$OUT"
mount -t tmpfs tmpfs "$OUT"

packages=$(sort -u /sys/devices/system/cpu/cpu[0-9]*/topology/physical_package_id | wc -l)
nodes=$(find /sys/devices/system/node -maxdepth 1 -name 'node[0-9]*' | wc -l)
say "kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime) s; sysfs: packages=$packages nodes=$nodes cpus=$(nproc)"
say "headers: $(readlink -f "/lib/modules/$(uname -r)/build")"

# kvprof's own reading of the topology, the one record puts in the profile.
t=$EPOCHREALTIME
python3 - >"$OUT/topology.txt" <<'EOF' || die "kvprof could not read the topology"
from kvprof.model.topology import Topology

t = Topology.read()
nodes = sorted({p.node for p in t.cpus.values()})
print(f"kvprof topology: cpus={len(t.cpus)} sockets={len(t.sockets)} nodes={len(nodes)}")
for cpu, p in t.cpus.items():
    print(f"  cpu {cpu}: core {p.core} socket {p.socket} node {p.node}")
EOF
while read -r line; do say "$line"; done <"$OUT/topology.txt"
say "stage topology $(elapsed "$t") s"

# Workers 0-1 on the first socket's CPUs, 2-3 on the second's (kvcached
# --cpu-affinity pins worker i to the i-th CPU of the list): every update of a
# shared counter then has a peer on the other socket.
mapfile -t by_socket < <(for d in /sys/devices/system/cpu/cpu[0-9]*; do
    echo "$(cat "$d/topology/physical_package_id") ${d##*/cpu}"
done | sort -n -k1,1 -k2,2 | awk '{print $2}')
affinity=$(
    IFS=,
    echo "${by_socket[*]}"
)

t=$EPOCHREALTIME
"$K/server/build/kvcached" -p "$PORT" -t 4 --preset baseline --probe-sample "$PROBE_SAMPLE" \
    --cpu-affinity "$affinity" >"$OUT/kvcached.log" 2>&1 &
SERVER=$!
for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    kill -0 "$SERVER" 2>/dev/null || die "kvcached exited: $(cat "$OUT/kvcached.log")"
    sleep 0.1
done

# What the kernel says each worker may run on. The workers name themselves
# once running, which under TCG can be a while after the listen.
workers=()
for _ in $(seq 300); do
    workers=()
    for task in /proc/"$SERVER"/task/*; do
        if [[ $(cat "$task/comm" 2>/dev/null) == kv-worker-* ]]; then workers+=("${task##*/}"); fi
    done
    if [[ ${#workers[@]} -eq 4 ]]; then break; fi
    sleep 0.1
done
[[ ${#workers[@]} -eq 4 ]] || die "kvcached has ${#workers[@]} named workers, not 4"
for tid in "${workers[@]}"; do
    name=$(cat "/proc/$SERVER/task/$tid/comm")
    cpu=$(awk '$1 == "Cpus_allowed_list:" {print $2}' "/proc/$SERVER/task/$tid/status")
    [[ $cpu =~ ^[0-9]+$ ]] || die "$name is not pinned to one CPU (allowed: $cpu)"
    say "pinned $name (tid $tid) to CPU $cpu, socket $(cat "/sys/devices/system/cpu/cpu$cpu/topology/physical_package_id")"
done

# 8 connections: kvcached hands them to its workers in turn, two each. Two,
# so that every worker still gets one when a connection of record's (it reads
# the server's stats) comes between them.
LOAD_ARGS=(--server "127.0.0.1:$PORT" --num-threads 2 --connections 4 --batch-size 16
    --set-pct 5 --num-items 1000 --min-size 32 --max-size 64)
timeout 60 "$K/server/build/kvload" "${LOAD_ARGS[@]}" --populate-only >"$OUT/kvload-populate.log" 2>&1 ||
    die "kvload --populate-only failed or took over 60 s: $(tail -n 3 "$OUT/kvload-populate.log")"
say "stage start $(elapsed "$t") s: kvcached PID $SERVER (baseline, 4 workers, --probe-sample $PROBE_SAMPLE), 1000 keys stored"

# The load starts once record has attached: under TCG the four vCPUs share
# the host's cores, and a loaded guest would slow BCC's compile several
# times over.
t=$EPOCHREALTIME
python3 -m kvprof record -p "$SERVER" -d "$RECORD_SECONDS" -o "$OUT/profile.json" \
    --collectors cachelines >"$OUT/record.log" 2>&1 &
REC=$!
wait_attached "$REC" "$OUT/record.log" holds_perf_events "$REC"
attached=no
if holds_perf_events "$REC"; then attached=yes; fi
say "stage attach $(elapsed "$t") s (attached: $attached)"
"$K/server/build/kvload" "${LOAD_ARGS[@]}" --no-population --duration 3600 >"$OUT/kvload.log" 2>&1 &
LOAD=$!
rc=0
wait_recorded "$REC" "$OUT/record.log" "$RECORD_SECONDS" || rc=$?
while read -r line; do say "record: $line"; done <"$OUT/record.log"
say "stage record $(elapsed "$t") s (exit $rc)"
[[ $rc -eq 0 ]] || die "kvprof record failed"
kill -0 "$LOAD" 2>/dev/null || die "kvload stopped early: $(tail -n 5 "$OUT/kvload.log")"

# A short second recording with the stack collectors (on-CPU, off-CPU, futex
# waits): the host checks that none of the guest kernel's BPF frames reaches a
# stack (tests/test_vm.py). Off-CPU with every switch timed (--offcpu-hz 0): its
# stacks are taken inside BPF, on sched_switch, and every futex wait is counted
# (the sampled default takes them from outside, and may see none in 3 s). As for
# the first, the load stops while it compiles.
stop_load
t=$EPOCHREALTIME
python3 -m kvprof record -p "$SERVER" -d 3 -o "$OUT/stacks.json" \
    --collectors oncpu,offcpu --offcpu-hz 0 >"$OUT/record-stacks.log" 2>&1 &
REC=$!
wait_attached "$REC" "$OUT/record-stacks.log" grep -q collecting "$OUT/record-stacks.log"
say "stage attach-stacks $(elapsed "$t") s"
"$K/server/build/kvload" "${LOAD_ARGS[@]}" --no-population --duration 3600 >>"$OUT/kvload.log" 2>&1 &
LOAD=$!
rc=0
wait_recorded "$REC" "$OUT/record-stacks.log" 3 || rc=$?
say "stage record-stacks $(elapsed "$t") s (exit $rc)"
[[ $rc -eq 0 ]] || die "kvprof record of the stacks failed: $(tail -n 3 "$OUT/record-stacks.log")"
