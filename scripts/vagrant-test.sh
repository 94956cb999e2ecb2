#!/usr/bin/env bash
# make vagrant-test: `vagrant up` the project's Vagrantfile for real, with the
# local box of `make vagrant-box` (kvprof-local/debian12) under QEMU's emulated
# CPU, and profile kvcached inside it.
#
#   scripts/vagrant-test.sh [--out DIR]     (default build/vagrant/out)
#
# Steps, each timed; a failure names its step, with that step's output above:
#   namespace  a network and mount namespace of this test's own (see below)
#   libvirtd   a libvirtd of its own in it, stopped at the end
#   up         vagrant up --provider libvirt, KVPROF_BOX=kvprof-local/debian12
#              KVPROF_VM_DRIVER=qemu: the Vagrantfile's 4 vCPUs as 2 sockets,
#              2 NUMA nodes, rsync of this checkout to /vagrant, and
#              scripts/provision.sh run inside (offline: see vagrant-box.sh)
#   doctor     vagrant ssh: sudo .venv/bin/kvprof doctor, which must exit 0
#   topology   vagrant ssh: nproc and lscpu: 4 CPUs, 2 sockets, 2 NUMA nodes
#   record     vagrant ssh: scripts/vagrant-guest-record.sh (kvcached baseline
#              under kvload, kvprof record --collectors cachelines); the profile
#              comes back through vagrant ssh and kvprof report reads it here:
#              its socket matrix must be 2x2 with both cross-socket cells > 0
#   destroy    vagrant destroy -f
#   leftovers  no domain or network left in libvirt; the box's volume, which
#              vagrant-libvirt keeps in its pool by design, and the pool go
#
# The network: libvirt and Vagrant run in a network namespace this test
# creates (unshare --net) and that ends with it, so vagrant-libvirt's
# management network (a bridge, 192.168.121.0/24, dnsmasq, NAT rules) and
# every packet to the guest stay inside it. It has no way out: nothing is sent
# to this machine's network at all, and the guest installs nothing from the
# network (the box has it all). The mount namespace (unshare --mount) gives
# that libvirtd its own /etc/libvirt, /run and /var (an overlay whose writes
# land in the test's temporary folder), so no libvirt state (domain, volume,
# network, pool definitions) is written to this machine, and a libvirtd of
# the machine's own, if one runs, is neither used nor touched. Vagrant's
# state for the machine is in a temporary VAGRANT_DOTFILE_PATH, not in the
# checkout. Needs root (namespaces, libvirtd) and `scripts/provision.sh --vagrant`.
set -euo pipefail

# shellcheck disable=SC2034  # read by vagrant-lib.sh
ME=vagrant-test
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/vagrant-lib.sh
. "$REPO/scripts/vagrant-lib.sh"
OUT=$VAGRANT_WORK/out
INSIDE=

while [[ $# -gt 0 ]]; do
    case "$1" in
        --out)
            [[ $# -ge 2 ]] || die "--out needs a folder"
            OUT=$2
            shift
            ;;
        --inside) # the part that runs in the namespaces (this script, re-run by itself)
            INSIDE=$2
            shift
            ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *) die "unknown argument $1 (try --help)" ;;
    esac
    shift
done

# =============================== outside ===========================================

if [[ -z $INSIDE ]]; then
    [[ $(id -u) -eq 0 ]] || die "needs root (namespaces and libvirtd): run it with sudo"
    for tool in unshare libvirtd virsh vagrant dnsmasq iptables qemu-system-x86_64 rsync; do
        command -v "$tool" >/dev/null || die "$tool is missing: run scripts/provision.sh --vagrant"
    done
    vagrant_global plugin list 2>/dev/null | grep -q '^vagrant-libvirt ' || die "the vagrant-libvirt plugin is missing: run scripts/provision.sh"
    vagrant_global box list 2>/dev/null | grep -q "^$KVPROF_LOCAL_BOX " ||
        die "Vagrant has no box $KVPROF_LOCAL_BOX: run make vagrant-box"
    mkdir -p "$VAGRANT_WORK" "$OUT"
    OUT=$(cd "$OUT" && pwd)
    exec 9>"$VAGRANT_WORK/.lock"
    flock -n 9 || die "another vagrant-box or vagrant-test is running on $VAGRANT_WORK"
    if pid=$(pgrep -x libvirtd | head -n 1) && [[ -n $pid ]]; then
        log "this machine's libvirtd (PID $pid) runs: not used; the test runs a libvirtd of its own in its namespace"
    fi
    TMP=$(mktemp -d /tmp/kvprof-vagrant-test.XXXXXX)
    T0=$EPOCHREALTIME
    rc=0
    unshare --mount --net --fork --propagation private bash "$0" --inside "$TMP" --out "$OUT" || rc=$?
    # Whatever still runs in the test's network namespace was started by it.
    left=()
    if [[ -s $TMP/netns ]]; then
        for p in /proc/[0-9]*; do
            [[ $(readlink "$p/ns/net" 2>/dev/null) == "$(cat "$TMP/netns")" ]] && left+=("${p#/proc/}")
        done
    fi
    if [[ ${#left[@]} -gt 0 ]]; then
        log "still running in the test's namespace, stopping: $(ps -o pid=,comm= -p "$(
            IFS=,
            echo "${left[*]}"
        )" | tr '\n' ' ')"
        kill "${left[@]}" 2>/dev/null || true
        sleep 2
        kill -9 "${left[@]}" 2>/dev/null || true
        [[ $rc -ne 0 ]] || rc=1
    fi
    # The machine index entry goes with vagrant destroy; one of a failed run's
    # machine (its dotfile folder is about to go) goes with --prune.
    if [[ $rc -ne 0 ]]; then vagrant_global global-status --prune >/dev/null 2>&1 || true; fi
    rm -rf --one-file-system "$TMP"
    if [[ $rc -eq 0 ]]; then
        log "ok in $(seconds_since "$T0") s in all; output in $OUT"
    else
        log "FAILED (exit $rc) after $(seconds_since "$T0") s; output in $OUT"
    fi
    exit "$rc"
fi

# =============================== inside ============================================
# New network and mount namespaces: only lo, and mounts that this process's
# exit takes away.

TMP=$INSIDE
readlink /proc/self/ns/net >"$TMP/netns"
DOT=$TMP/dot-vagrant
LV=$TMP/libvirt
export VAGRANT_DOTFILE_PATH=$DOT
export KVPROF_BOX=$KVPROF_LOCAL_BOX KVPROF_VM_DRIVER=qemu
export LIBVIRT_DEFAULT_URI=qemu:///system
T0=$EPOCHREALTIME
rm -f "$OUT"/{vagrant-up.log,doctor.txt,lscpu.txt,profile.json,record.txt,report.txt}

LIBVIRTD=
UP_STARTED=no
cleanup() {
    local rc=$?
    set +e
    if [[ $UP_STARTED == yes && -d $DOT/machines ]]; then
        log "cleanup: vagrant destroy -f"
        (cd "$REPO" && timeout 300 vagrant destroy -f) >"$OUT/vagrant-destroy-cleanup.log" 2>&1
    fi
    if [[ -n $LIBVIRTD ]] && kill -0 "$LIBVIRTD" 2>/dev/null; then
        log "stopping the test's libvirtd (PID $LIBVIRTD)"
        kill "$LIBVIRTD"
        for _ in $(seq 50); do kill -0 "$LIBVIRTD" 2>/dev/null || break; sleep 0.2; done
    fi
    [[ -f $LV/log/libvirtd.log ]] && cp "$LV/log/libvirtd.log" "$OUT/libvirtd.log"
    cp "$TMP"/var-up/log/libvirt/qemu/*.log "$OUT/" 2>/dev/null
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

namespace() {
    # (step runs this as an `||` operand, where set -e does not hold: hence the returns.)
    mkdir -p "$LV/etc" "$LV/log" "$TMP/var-up" "$TMP/var-work" || return 1
    mount -t overlay overlay -o "lowerdir=/var,upperdir=$TMP/var-up,workdir=$TMP/var-work" /var || return 1
    mount -t tmpfs tmpfs /run || return 1
    mount --bind "$LV/etc" /etc/libvirt || return 1
    cat >"$LV/etc/libvirtd.conf" <<EOF
log_outputs = "3:file:$LV/log/libvirtd.log"
EOF
    # QEMU runs as root (the box and its volumes are root's); its console
    # output goes to a file (no virtlogd).
    printf 'user = "root"\ngroup = "root"\nstdio_handler = "file"\n' >"$LV/etc/qemu.conf"
    # Debian's libvirtd looks up its QEMU user, libvirt-qemu, before it reads
    # qemu.conf; libvirt-daemon-system makes that user. Without it, the
    # namespace's /etc/passwd and /etc/group have it (this machine's do not).
    if ! getent passwd libvirt-qemu >/dev/null; then
        cp /etc/passwd "$LV/passwd"
        cp /etc/group "$LV/group"
        echo 'libvirt-qemu:x:64055:64055:libvirt QEMU (vagrant-test namespace only):/nonexistent:/usr/sbin/nologin' >>"$LV/passwd"
        echo 'libvirt-qemu:x:64055:' >>"$LV/group"
        mount --bind "$LV/passwd" /etc/passwd || return 1
        mount --bind "$LV/group" /etc/group || return 1
    fi
    ip link set lo up || return 1
    log "network namespace $(cat "$TMP/netns"): $(ip -br link | awk '{print $1}' | tr '\n' ' ')"
}

start_libvirtd() {
    /usr/sbin/libvirtd --daemon --config "$LV/etc/libvirtd.conf"
    for _ in $(seq 100); do
        [[ -S /run/libvirt/libvirt-sock && -s /run/libvirtd.pid ]] && break
        sleep 0.1
    done
    LIBVIRTD=$(cat /run/libvirtd.pid 2>/dev/null || true)
    [[ -n $LIBVIRTD ]] || {
        tail -n 20 "$LV/log/libvirtd.log" >&2
        return 1
    }
    virsh version --daemon | sed -n 's/^Running against daemon: /libvirtd /p; s/^Running hypervisor: //p'
}

# vm COMMAND...: a vagrant command in the checkout, its output shown and kept.
vm() { (cd "$REPO" && "$@"); }

up() {
    UP_STARTED=yes
    # The whole output in the log; on the terminal without the box upload's
    # thousands of "Progress: N%" updates.
    vm timeout 5400 vagrant up --provider libvirt 2>&1 | tee "$OUT/vagrant-up.log" |
        sed -u 's/.*Progress: [0-9]*%.*\r//; s/\r$//' | grep --line-buffered -v 'Progress: [0-9]*%'
    [[ ${PIPESTATUS[0]} -eq 0 ]]
}

doctor() {
    vm vagrant ssh -c 'cd /vagrant && sudo .venv/bin/kvprof doctor' 2>&1 | tee "$OUT/doctor.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]]
}

topology() {
    vm vagrant ssh --no-tty -c 'echo "nproc: $(nproc)"; lscpu' >"$OUT/lscpu.txt" 2>&1 || {
        cat "$OUT/lscpu.txt"
        return 1
    }
    grep -E '^(nproc|CPU\(s\)|Model name|Thread|Core|Socket|NUMA)' "$OUT/lscpu.txt"
    local cpus sockets nodes
    cpus=$(awk '$1 == "nproc:" {print $2}' "$OUT/lscpu.txt" | tr -d '\r')
    sockets=$(awk -F: '$1 == "Socket(s)" {gsub(/[ \r]/, "", $2); print $2}' "$OUT/lscpu.txt")
    nodes=$(awk -F: '$1 == "NUMA node(s)" {gsub(/[ \r]/, "", $2); print $2}' "$OUT/lscpu.txt")
    [[ $cpus == 4 && $sockets == 2 && $nodes == 2 ]] || {
        echo "the guest has $cpus CPUs, $sockets sockets, $nodes NUMA nodes; wanted 4, 2, 2" >&2
        return 1
    }
}

record() {
    vm vagrant ssh -c 'cd /vagrant && sudo bash scripts/vagrant-guest-record.sh /tmp/kvprof-vagrant 8' 2>&1 |
        tee "$OUT/record.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || return 1
    # Back through vagrant ssh, and read here by this checkout's kvprof.
    vm vagrant ssh --no-tty -c 'cat /tmp/kvprof-vagrant/profile.json' >"$OUT/profile.json" 2>/dev/null || return 1
    "$REPO/.venv/bin/kvprof" report "$OUT/profile.json" >"$OUT/report.txt" || {
        head -n 5 "$OUT/profile.json" >&2
        return 1
    }
    sed -n '/^  window:/,/^  collectors:/p; /^CACHE LINES/,/^$/p; /^transfers\/s, from socket/,/^$/p' "$OUT/report.txt"
    "$REPO/.venv/bin/kvprof" report --json "$OUT/profile.json" | "$REPO/.venv/bin/python" -c '
import json, sys
m = json.load(sys.stdin)["tables"]["socket_matrix"]
print("socket matrix from report --json (transfers/s):", [[round(v, 1) for v in row] for row in m])
ok = len(m) == 2 and all(len(r) == 2 for r in m) and m[0][1] > 0 and m[1][0] > 0
sys.exit(0 if ok else "the socket matrix is not 2x2 with both cross-socket cells > 0")'
}

destroy() {
    UP_STARTED=no
    vm timeout 600 vagrant destroy -f 2>&1 | tee "$OUT/vagrant-destroy.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]]
}

leftovers() {
    local doms nets vols
    doms=$(virsh list --all --name | grep . || true)
    nets=$(virsh net-list --all --name | grep . || true)
    vols=$(virsh vol-list default 2>/dev/null | awk 'NR > 2 && $1 {print $1}' || true)
    echo "after vagrant destroy: domains [${doms//$'\n'/ }], networks [${nets//$'\n'/ }], volumes in pool default [${vols//$'\n'/ }]"
    [[ -z $doms && -z $nets ]] || {
        echo "vagrant destroy left a domain or network behind" >&2
        return 1
    }
    local v
    for v in $vols; do virsh vol-delete --pool default "$v" >/dev/null; done
    if virsh pool-info default >/dev/null 2>&1; then
        virsh pool-destroy default >/dev/null
        virsh pool-undefine default >/dev/null
    fi
    [[ -z $(virsh pool-list --all --name | grep .) ]]
}

stop_libvirtd() {
    kill "$LIBVIRTD"
    for _ in $(seq 100); do
        kill -0 "$LIBVIRTD" 2>/dev/null || break
        sleep 0.1
    done
    ! kill -0 "$LIBVIRTD" 2>/dev/null
    LIBVIRTD=
}

step namespace namespace
step libvirtd start_libvirtd
step up up
step doctor doctor
step topology topology
step record record
step destroy destroy
step leftovers leftovers
step stop-libvirtd stop_libvirtd
log "passed in $(seconds_since "$T0") s ($(times_line))"
