#!/usr/bin/env bash
# make vm-test: boot a two-socket, two-NUMA-node Debian guest under QEMU TCG
# and record kvcached in it with kvprof, so the per-socket views are checked on
# a real multi-socket topology on every CI run (the machines here have one
# socket, and their /dev/kvm cannot run a stock kernel: hence -accel tcg).
#
#   scripts/vm-test.sh [--out DIR] [--rebuild] [--keep]
#
#   --out DIR   where the guest's output lands (default build/vm/out): profile.json,
#               kvcached/kvload/record logs, topology.txt, exit-status, serial.log
#   --rebuild   rebuild the cached guest image even when it is up to date
#   --keep      keep the rootfs folder after making the image (for poking at it)
#
# Stages, each timed:
#   rootfs   debootstrap --variant=minbase bookworm, plus what `kvprof record`
#            needs in the guest and nothing else: python3-bpfcc (BCC), binutils
#            (readelf finds the kvs probes) and linux-headers-$KVER matching the
#            guest kernel, from Debian's security suite like the kernel. This is
#            the guest SUBSET of scripts/provision.sh, not provision.sh itself:
#            the guest runs nothing that needs the rest (compilers, memcached,
#            redis, the .venv with its PyPI packages), and a chroot has a
#            different `uname -r` than the guest it is for, which provision.sh
#            would resolve headers against. kvprof itself is not installed in the
#            guest: it runs from the payload below with the guest's python3
#            (record needs only the standard library and BCC).
#   kernel   Debian's linux-image-$KVER (vmlinuz and the modules the initrd needs)
#   initrd   busybox-static + virtio/ext4 modules + scripts/vm-initrd-init.sh
#   image    the rootfs as an ext4 image (mkfs.ext4 -d: no loop device, no mount)
#   payload  this checkout's kvprof/ (its BPF programs in kvprof/probes/), kvcached, kvload and
#            scripts/vm-guest-init.sh as a tar on a second disk
#   boot     qemu-system-x86_64 -accel tcg -smp 4,sockets=2,cores=2 with two
#            NUMA nodes; the guest runs scripts/vm-guest-init.sh and writes its
#            output as a tar onto a third disk, then powers off
#   readback the host untars the third disk into --out
#
# The first four are cached in build/vm (gitignored) and rebuilt when this
# script's guest recipe changes or with --rebuild; a fresh clone builds them
# (docs/vm.md has the times). Everything this starts is stopped on exit, and it
# mounts nothing on the host (debootstrap mounts /proc and /sys inside the
# rootfs while it runs; anything left mounted under build/vm is unmounted).
#
# Environment: KVPROF_VM_DIR (cache, default build/vm), KVPROF_VM_MIRROR and
# KVPROF_VM_SECURITY_MIRROR (Debian mirrors; default: the host's, else
# deb.debian.org), KVPROF_VM_TIMEOUT (seconds the guest may run, default 600).
# Needs root (debootstrap, chroot) and qemu-system-x86, debootstrap, e2fsprogs
# (scripts/provision.sh installs them).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${KVPROF_VM_DIR:-$REPO/build/vm}
OUT=$WORK/out
REBUILD=no
KEEP=no
GUEST_TIMEOUT=${KVPROF_VM_TIMEOUT:-600}
# qemu64 (SSE2) plus rdtscp, which kvcached's cycle counts use: with -cpu
# max, glibc and LLVM pick AVX code paths that TCG emulates slowly (docs/vm.md
# has the guest's record with each).
GUEST_CPU=${KVPROF_VM_CPU:-qemu64,+rdtscp}
SUITE=bookworm
# What the guest needs (see above). Changing this list rebuilds the image.
GUEST_PACKAGES=(python3 python3-bpfcc python3-pyelftools python3-capstone binutils)
# Bump to rebuild cached images when the way they are made changes.
RECIPE=4

while [[ $# -gt 0 ]]; do
    case "$1" in
        --out)
            [[ $# -ge 2 ]] || { echo "vm-test: --out needs a folder" >&2; exit 2; }
            OUT=$2
            shift
            ;;
        --rebuild) REBUILD=yes ;;
        --keep) KEEP=yes ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "vm-test: unknown argument $1 (try --help)" >&2
            exit 2
            ;;
    esac
    shift
done

log() { printf 'vm-test: %s\n' "$*"; }
die() {
    printf 'vm-test: error: %s\n' "$*" >&2
    exit 1
}

[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap and chroot): run it with sudo"
for tool in qemu-system-x86_64 debootstrap mkfs.ext4 dpkg-deb chroot tar gzip; do
    command -v "$tool" >/dev/null || die "$tool is missing: run scripts/provision.sh (make setup)"
done
for f in server/build/kvcached server/build/kvload; do
    [[ -x $REPO/$f ]] || die "$f is missing: run make build"
done

mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOTFS=$WORK/rootfs
# debootstrap cannot build a root whose path has white space in it (its first
# chroot into the new root fails): a checkout in such a folder builds the root
# in a temporary folder instead (not reused by a later --keep run).
if [[ $ROOTFS =~ [[:space:]] ]]; then
    ROOTFS=$(mktemp -d /tmp/kvprof-vm-rootfs.XXXXXX)
fi
RUN=$WORK/run # per-run files: payload, output disk, serial log
IMAGE=$WORK/rootfs.ext4
KERNEL=$WORK/vmlinuz
INITRD=$WORK/initrd.gz

# One run at a time per cache folder (taken before the clean-up below is armed,
# so a refused run leaves the other one's files alone).
exec 9>"$WORK/.lock"
flock -n 9 || die "another vm-test is running on $WORK"

# --- cleanup: whatever we started or mounted, on any exit -------------------

# bounded SECONDS COMMAND...: the long steps (debootstrap, apt, qemu) run under
# timeout, in the background and waited for, so that a signal to this script
# runs the clean-up at once (bash holds traps until a foreground command ends);
# timeout runs each in a process group of its own and passes a signal on to
# all of it.
CHILD=
exec 8>&2
bounded() {
    timeout -k 10 "$1" "${@:2}" &
    CHILD=$!
    local rc=0
    wait "$CHILD" || rc=$?
    CHILD=
    return "$rc"
}

cleanup() {
    local rc=$?
    if [[ -n $CHILD ]] && kill -0 "$CHILD" 2>/dev/null; then
        # To fd 8, the script's own stderr: the step's redirections may still be in force.
        log "stopping what runs (PID $CHILD: $(tr '\0' ' ' <"/proc/$CHILD/cmdline" 2>/dev/null | cut -c1-60))" >&8
        kill "$CHILD" 2>/dev/null || true
        wait "$CHILD" 2>/dev/null || true
    fi
    # debootstrap mounts /proc and /sys in the rootfs and may leave them when killed.
    local m
    while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done < <(awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r)
    if [[ $KEEP == no && -d $ROOTFS ]]; then
        rm -rf --one-file-system "$ROOTFS"
    fi
    rm -rf "$RUN" "$WORK/kx" "$WORK/bb" "$WORK/initrd"
    rm -f "$IMAGE.new" "$KERNEL.new" "$INITRD.new"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM


# --- timing -------------------------------------------------------------------

T_START=$EPOCHREALTIME
TIMES=()
stage() {
    local name=$1 t0=$EPOCHREALTIME
    shift
    log "stage $name..."
    "$@"
    local took
    took=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')
    TIMES+=("$name ${took}s")
    log "stage $name took $took s"
}

# --- mirrors --------------------------------------------------------------------

# The host's Debian mirrors when it has them (deb822 debian.sources), so the
# guest uses the same archive as everything else on this machine.
host_uri() { # $1: pattern the stanza's Suites must match
    awk -v want="$1" '
        /^URIs:/ {uri = $2}
        /^Suites:/ {for (i = 2; i <= NF; i++) if ($i ~ want) {print uri; exit}}
        /^$/ {uri = ""}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true
}
MIRROR=${KVPROF_VM_MIRROR:-$(host_uri "^$SUITE\$")}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=${KVPROF_VM_SECURITY_MIRROR:-$(host_uri "^$SUITE-security\$")}
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}

# --- the cached guest: rootfs image, kernel, initrd ------------------------------

# Two cached artifacts, each with a stamp of what it was made from: the image
# (and the kernel packages fetched with it), and the kernel + initrd.
IMAGE_KEY=$(printf '%s\n' "$RECIPE" "$SUITE" "$MIRROR" "$SECURITY" "${GUEST_PACKAGES[*]}" |
    sha256sum | cut -d' ' -f1)
BOOT_KEY=$(printf '%s\n' "$IMAGE_KEY" | cat - "$REPO/scripts/vm-initrd-init.sh" | sha256sum | cut -d' ' -f1)
fresh() { [[ $REBUILD == no && -f $1 && $(cat "$1") == "$2" ]]; }

# in_root SECONDS COMMAND...: run in the rootfs, bounded (a stalled mirror
# must not hang CI).
in_root() { bounded "$1" chroot "$ROOTFS" env DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 "${@:2}"; }

make_rootfs() {
    rm -rf --one-file-system "$ROOTFS"
    local inc
    inc=$(
        IFS=,
        echo "${GUEST_PACKAGES[*]}"
    )
    if ! bounded 900 debootstrap --variant=minbase --include="$inc" "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
        tail -n 30 "$WORK/debootstrap.log" >&2
        die "debootstrap failed (whole log: $WORK/debootstrap.log)"
    fi
}

# The kernel and the headers come from the same package index, in the same
# run, so they always match (the security suite moves both together).
guest_packages() {
    rm -f "$ROOTFS/etc/apt/sources.list"
    cat >"$ROOTFS/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    in_root 300 apt-get update -qq || die "apt-get update in the guest rootfs failed"
    KPKG=$(in_root 60 apt-cache depends linux-image-amd64 | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')
    [[ -n $KPKG ]] || die "cannot resolve linux-image-amd64 in the guest's package index"
    KVER=${KPKG#linux-image-}
    echo "$KVER" >"$WORK/kver"
    if ! in_root 600 apt-get install -y -q -o Dpkg::Use-Pty=0 --no-install-recommends "linux-headers-$KVER" >"$WORK/apt.log" 2>&1; then
        tail -n 30 "$WORK/apt.log" >&2
        die "installing linux-headers-$KVER in the guest failed (whole log: $WORK/apt.log)"
    fi
    in_root 300 sh -c "cd /tmp && apt-get download -q=2 $KPKG busybox-static" ||
        die "cannot download $KPKG and busybox-static"
    rm -rf "$WORK/debs"
    mkdir -p "$WORK/debs"
    mv "$ROOTFS"/tmp/*.deb "$WORK/debs/"
    # What only the build needed: package lists, caches, docs.
    in_root 60 apt-get clean
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/usr/share/{doc,man,info,locale}/*
}

make_kernel() {
    KVER=$(cat "$WORK/kver")
    rm -rf "$WORK/kx" "$WORK/bb"
    # Only the kernel and the modules the initrd takes, not the whole package.
    mkdir -p "$WORK/kx"
    dpkg-deb --fsys-tarfile "$WORK/debs/linux-image-${KVER}"_*.deb |
        tar -x -C "$WORK/kx" --wildcards "./boot/vmlinuz-$KVER" "./lib/modules/$KVER/modules.*" \
            "./lib/modules/$KVER/kernel/drivers/virtio/*" "./lib/modules/$KVER/kernel/drivers/block/*" \
            "./lib/modules/$KVER/kernel/fs/*" "./lib/modules/$KVER/kernel/lib/*" \
            "./lib/modules/$KVER/kernel/crypto/*"
    dpkg-deb -x "$WORK"/debs/busybox-static_*.deb "$WORK/bb"
    cp "$WORK/kx/boot/vmlinuz-$KVER" "$KERNEL.new"
}

# The modules for virtio disks and ext4 and what they need (Debian's kernel has
# them as modules), picked by path from modules.order; busybox depmod then
# writes the initrd's own modules.dep for busybox modprobe.
INITRD_MODULES='^kernel/(drivers/virtio/|drivers/block/virtio_blk|fs/ext4/|fs/jbd2/|fs/mbcache|lib/crc16|crypto/crc32c_generic|lib/libcrc32c)'
make_initrd() {
    local ir=$WORK/initrd mods=$WORK/kx/lib/modules/$KVER bb=$WORK/bb/bin/busybox f n=0
    rm -rf "$ir"
    mkdir -p "$ir"/{bin,sbin,proc,sys,dev,newroot,lib/modules/"$KVER"}
    cp "$bb" "$ir/bin/busybox"
    cp "$REPO/scripts/vm-initrd-init.sh" "$ir/init"
    chmod 755 "$ir/init"
    while read -r f; do
        mkdir -p "$ir/lib/modules/$KVER/${f%/*}"
        cp "$mods/$f" "$ir/lib/modules/$KVER/$f"
        n=$((n + 1))
    done < <(grep -E "$INITRD_MODULES" "$mods/modules.order")
    [[ $n -gt 0 ]] || die "no virtio/ext4 modules found in linux-image-$KVER"
    cp "$mods"/modules.{order,builtin} "$ir/lib/modules/$KVER/"
    "$bb" depmod -b "$ir" "$KVER"
    (cd "$ir" && find . | "$bb" cpio -o -H newc 2>/dev/null | gzip -1 >"$INITRD.new")
    rm -rf "$ir"
}

make_image() {
    local mb
    # The rootfs plus room for the payload and /tmp writes (the disk is
    # opened with snapshot=on, so they are thrown away).
    mb=$(($(du -sm "$ROOTFS" | cut -f1) + 512))
    rm -f "$IMAGE.new"
    mkfs.ext4 -q -F -L kvprof-guest -d "$ROOTFS" "$IMAGE.new" "${mb}M" >/dev/null
}

build_image() {
    rm -f "$WORK/image.stamp" "$WORK/boot.stamp"
    # A rootfs folder kept by --keep from a run with the same recipe is reused.
    if fresh "$ROOTFS/.kvprof-stamp" "$IMAGE_KEY" && [[ -f $WORK/kver ]]; then
        log "reusing the rootfs folder kept by --keep"
    else
        stage rootfs make_rootfs
        stage packages guest_packages
        echo "$IMAGE_KEY" >"$ROOTFS/.kvprof-stamp"
    fi
    stage image make_image
    mv "$IMAGE.new" "$IMAGE"
    echo "$IMAGE_KEY" >"$WORK/image.stamp"
}

build_boot() {
    rm -f "$WORK/boot.stamp"
    stage kernel make_kernel
    stage initrd make_initrd
    mv "$KERNEL.new" "$KERNEL"
    mv "$INITRD.new" "$INITRD"
    rm -rf "$WORK/kx" "$WORK/bb"
    echo "$BOOT_KEY" >"$WORK/boot.stamp"
}

if fresh "$WORK/image.stamp" "$IMAGE_KEY" && [[ -f $IMAGE && -f $WORK/kver ]] &&
    compgen -G "$WORK/debs/linux-image-*.deb" >/dev/null; then
    log "guest image cached: $IMAGE (--rebuild to make it anew)"
    TIMES+=("image cached")
else
    log "building the guest image in $WORK (Debian $SUITE from $MIRROR)"
    build_image
fi
KVER=$(cat "$WORK/kver")
if fresh "$WORK/boot.stamp" "$BOOT_KEY" && [[ -f $KERNEL && -f $INITRD ]]; then
    TIMES+=("kernel+initrd cached")
else
    build_boot
fi

# --- payload: this checkout, as a tar on the second disk -------------------------

make_payload() {
    rm -rf "$RUN"
    mkdir -p "$RUN"
    {
        echo "PROBE_SAMPLE=${KVPROF_VM_PROBE_SAMPLE:-4}"
        echo "RECORD_SECONDS=${KVPROF_VM_RECORD_SECONDS:-8}"
    } >"$RUN/vm.env"
    tar -c -f "$RUN/payload.tar" --owner=0 --group=0 \
        --exclude=__pycache__ --exclude='*.pyc' \
        -C "$REPO" kvprof server/build/kvcached server/build/kvload scripts/vm-guest-init.sh \
        -C "$RUN" vm.env
    # The guest writes its output tar from the start of this disk.
    truncate -s 64M "$RUN/out.img"
}
stage payload make_payload

# --- boot -------------------------------------------------------------------------

# What the guest kernel prints when a vCPU made no progress for many seconds.
# Under TCG on a loaded two-core host a boot can hang so (twice in one day,
# once in the kernel's crypto self-tests): that is QEMU's, not kvprof's.
STALL='watchdog: BUG: soft lockup'

# One boot; 75 when the guest kernel reported a stalled vCPU (QEMU is stopped
# at once then, not left to run into the timeout).
boot_once() {
    local serial=$1 rc=0
    rm -f "$serial"
    # TCG, not KVM: /dev/kvm here is a nested device that cannot run a stock
    # kernel, and `-accel kvm:tcg` would not fall back because KVM starts
    # fine. QEMU 7.2 wants one memory backend per NUMA node.
    timeout -k 10 "$GUEST_TIMEOUT" qemu-system-x86_64 \
        -accel tcg -cpu "$GUEST_CPU" -m 2048 \
        -smp 4,sockets=2,cores=2,threads=1 \
        -object memory-backend-ram,id=m0,size=1024M -object memory-backend-ram,id=m1,size=1024M \
        -numa node,nodeid=0,cpus=0-1,memdev=m0 -numa node,nodeid=1,cpus=2-3,memdev=m1 \
        -kernel "$KERNEL" -initrd "$INITRD" \
        -append 'console=ttyS0 panic=-1 quiet mitigations=off' \
        -drive "file=$IMAGE,if=virtio,format=raw,snapshot=on" \
        -drive "file=$RUN/payload.tar,if=virtio,format=raw,readonly=on" \
        -drive "file=$RUN/out.img,if=virtio,format=raw" \
        -display none -monitor none -serial "file:$serial" -no-reboot &
    CHILD=$!
    while kill -0 "$CHILD" 2>/dev/null; do
        if grep -q "$STALL" "$serial" 2>/dev/null; then
            kill "$CHILD" 2>/dev/null
            wait "$CHILD" 2>/dev/null
            CHILD=
            return 75
        fi
        sleep 2
    done
    wait "$CHILD" || rc=$?
    CHILD=
    return "$rc"
}

# What the guest printed (its VMTEST lines), then, when $2 is not 0, the last
# lines of its kernel's: a panic, a stall or a hung task shows there.
show_console() {
    local serial=$1 rc=$2
    [[ -f $serial ]] || return 0
    sed -n 's/^VMTEST /  guest: /p' "$serial" | tr -d '\r'
    if [[ $rc -ne 0 ]]; then
        { grep -av '^VMTEST ' "$serial" || true; } | tr -d '\r' | tail -n 20 | sed 's/^/  console: /'
    fi
}

# A guest that stalls (75) or runs past GUEST_TIMEOUT (124) is booted once
# more. Every wait of the guest's own is bounded well inside GUEST_TIMEOUT
# (scripts/vm-guest-init.sh says where a recording hangs and fails), so a
# guest that reaches the timeout stopped making progress as a whole: QEMU's.
boot() {
    local serial=$RUN/serial.log rc=0 why
    boot_once "$serial" || rc=$?
    if [[ $rc -eq 75 || $rc -eq 124 ]]; then
        show_console "$serial" "$rc"
        why="ran past ${GUEST_TIMEOUT}s"
        [[ $rc -eq 124 ]] || why="kernel reported a stalled vCPU ($(grep -m1 "$STALL" "$serial" | tr -d '\r'))"
        log "the guest $why: booting it once more (that console: $OUT/serial-stalled.log)"
        cp "$serial" "$OUT/serial-stalled.log"
        rc=0
        boot_once "$serial" || rc=$?
    fi
    if [[ -f $serial ]]; then cp "$serial" "$OUT/serial.log"; fi
    show_console "$serial" "$rc"
    [[ $rc -ne 75 ]] || die "the guest kernel reported a stalled vCPU on the last boot; serial log: $OUT/serial.log"
    [[ $rc -eq 0 ]] || die "qemu exited with $rc (124: the guest ran past ${GUEST_TIMEOUT}s); serial log: $OUT/serial.log"
}
stage boot boot

readback() {
    rm -f "$OUT"/{profile.json,stacks.json,exit-status,kvcached.log,kvload.log,record.log,record-stacks.log,topology.txt}
    tar -x -f "$RUN/out.img" -C "$OUT" || die "no output tar on the guest's third disk"
    [[ -f $OUT/exit-status ]] || die "the guest wrote no output (see $OUT/serial.log)"
    [[ $(cat "$OUT/exit-status") == 0 ]] || die "the guest run failed (exit $(cat "$OUT/exit-status")); see $OUT/serial.log"
    [[ -s $OUT/profile.json ]] || die "the guest wrote no profile"
}
stage readback readback

total=$(awk -v a="$T_START" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')
log "ok in $total s ($(
    IFS=,
    echo "${TIMES[*]}" | sed 's/,/, /g'
)): guest kernel $KVER, profile $OUT/profile.json"
