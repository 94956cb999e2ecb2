#!/usr/bin/env bash
# One idempotent set-up for kvprof, used by `make setup`, CI and the Vagrant VM:
# system packages, kernel headers for BCC, tracefs, the .venv and the kvcached
# build. A second run installs nothing, changes nothing and takes seconds.
#
# Works as root, or as an ordinary user who has sudo: then only the steps that
# need root (apt-get, mount, links in /lib/modules) go through sudo, each said
# out loud. Supported: Debian 12, Ubuntu 22.04 and 24.04.
#
#   scripts/provision.sh [--no-build] [--vagrant] [--print-packages]
#     --no-build        everything but building kvcached
#     --vagrant         also what `make vagrant-box` / `make vagrant-test` need on
#                       the host (a libvirt daemon, qemu-img, syslinux, mtools)
#     --print-packages  print the system packages this would install, and stop
set -euo pipefail

BUILD=yes
VAGRANT_HOST=no
PRINT_PACKAGES=no
for arg in "$@"; do
    case "$arg" in
        --no-build) BUILD=no ;;
        --vagrant) VAGRANT_HOST=yes ;;
        --print-packages) PRINT_PACKAGES=yes ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            printf 'provision: unknown argument %s (try --help)\n' "$arg" >&2
            exit 2
            ;;
    esac
done

START=$EPOCHREALTIME
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

log() { printf 'provision: %s\n' "$*"; }
warn() { printf 'provision: warning: %s\n' "$*" >&2; }
die() {
    printf 'provision: error: %s\n' "$*" >&2
    exit 1
}

# --- who runs what -----------------------------------------------------------

if [[ $(id -u) -eq 0 ]]; then
    ROOT=yes
elif command -v sudo >/dev/null 2>&1; then
    ROOT=no
else
    die "not root and no sudo: run this as root (packages, mounts and /lib/modules need it)"
fi

as_root() {
    if [[ $ROOT == yes ]]; then
        "$@"
    else
        log "sudo $*"
        sudo -- "$@"
    fi
}

# `sudo bash scripts/provision.sh` must not leave a root-owned .venv or build
# tree behind for the user who asked.
as_user() {
    if [[ $ROOT == yes && -n ${SUDO_USER:-} && ${SUDO_USER} != root ]]; then
        sudo -u "$SUDO_USER" -- "$@"
    else
        "$@"
    fi
}

# --- which system ------------------------------------------------------------

[[ -r /etc/os-release ]] || die "no /etc/os-release: only Debian 12 and Ubuntu 22.04/24.04 are supported"
# shellcheck disable=SC1091
. /etc/os-release
OS_ID=${ID:-unknown}
case "$OS_ID" in
    debian | ubuntu) ;;
    *)
        if [[ " ${ID_LIKE:-} " == *" debian "* ]]; then
            warn "$PRETTY_NAME is not Debian 12 or Ubuntu 22.04/24.04; trying it as Debian"
            OS_ID=debian
        else
            die "$PRETTY_NAME is not supported: use Debian 12, Ubuntu 22.04/24.04 or the Vagrant VM"
        fi
        ;;
esac

KREL=$(uname -r)
ARCH=$(dpkg --print-architecture)

# Python >= 3.11 from the distribution (BCC's python3-bpfcc lives in
# /usr/lib/python3/dist-packages, which only the distribution's Pythons see).
PY=/usr/bin/python3
PKGS=(
    build-essential pkg-config binutils
    systemtap-sdt-dev python3-pyparsing # the systemtap dtrace warns without pyparsing
    python3-bpfcc bpfcc-tools
    python3-pyelftools # unwind tables (kvprof/collect/unwind.py) and data symbols of futex words
    python3-venv python3-dev
    libmemcached-tools memcached redis-server
    tmux
    golang-go prometheus # `go tool pprof` reads the pprof export; Prometheus scrapes `kvprof exporter`
    python3-capstone python3-pyelftools # regsample: decode sampled IPs, name data symbols
    libc6-dbg # glibc's internal function names (its debug file by build-id: kvprof/collect/debuginfo.py)
    debuginfod elfutils # a local debuginfod server for tests/test_debuginfod.py (kvprof/collect/debuginfod.py)
    sysbench bpftrace # lock waits checked against an exact tracer (tests/test_lockwait_accuracy.py)
)
if [[ $OS_ID == ubuntu && ${VERSION_ID:-} == 22.04 ]]; then
    PY=/usr/bin/python3.11 # jammy's python3 is 3.10
    PKGS+=(python3.11 python3.11-venv python3.11-dev)
fi

installed() { [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]; }

available() { apt-cache show "$1" >/dev/null 2>&1; }

APT_UPDATED=no
apt_update_once() {
    if [[ $APT_UPDATED == no ]]; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq -o DPkg::Lock::Timeout=600
        APT_UPDATED=yes
    fi
}

# Debian's memcached and redis-server start a service on install; the tests
# start their own on free ports, so keep the distribution's from starting.
POLICY_RC=/usr/sbin/policy-rc.d
OUR_POLICY_RC=no
drop_policy_rc() {
    if [[ $OUR_POLICY_RC == yes ]]; then
        as_root rm -f "$POLICY_RC"
        OUR_POLICY_RC=no
    fi
}
trap drop_policy_rc EXIT

apt_install() {
    apt_update_once
    if [[ ! -e $POLICY_RC ]]; then
        printf '#!/bin/sh\n# kvprof provision: no service starts during apt-get install\nexit 101\n' |
            as_root tee "$POLICY_RC" >/dev/null
        as_root chmod 755 "$POLICY_RC"
        OUR_POLICY_RC=yes
    fi
    log "installing: $*"
    local apt_log
    apt_log=$(mktemp /tmp/kvprof-provision-apt.XXXXXX)
    if ! as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=600 --no-install-recommends "$@" >"$apt_log" 2>&1; then
        tail -n 40 "$apt_log" >&2
        die "apt-get install failed; its whole output is in $apt_log"
    fi
    rm -f "$apt_log"
    drop_policy_rc
}

# --- system packages ---------------------------------------------------------

# perf: Debian's linux-perf; Ubuntu's perf is per kernel and may not exist for
# a custom one (then `perf` is a wrapper that says so and PMU shows "unknown").
if [[ $OS_ID == debian ]]; then
    PKGS+=(linux-perf)
else
    PKGS+=(linux-tools-common)
fi
# The flame-graph SVG's browser test drives Debian's chromium with selenium.
# Ubuntu ships chromium only as a snap (no /usr/bin/chromium): the test skips there.
if [[ $OS_ID == debian ]]; then
    PKGS+=(chromium chromium-driver)
fi
# make vm-test boots a debootstrapped Debian guest under QEMU (Ubuntu needs
# Debian's archive key for that); make vm-check runs vagrant validate, with the
# libvirt plugin so the libvirt block is checked too, and shellcheck.
PKGS+=(qemu-system-x86 debootstrap e2fsprogs shellcheck)
# make fuzz: libFuzzer with ASan+UBSan from clang (its runtime is libclang-rt-N-dev).
PKGS+=(clang)
if [[ $OS_ID == debian ]]; then
    PKGS+=(libclang-rt-14-dev)
fi
VM_OPTIONAL=()
if [[ $OS_ID == debian ]]; then
    PKGS+=(vagrant vagrant-libvirt)
else
    PKGS+=(debian-archive-keyring)
    VM_OPTIONAL=(vagrant vagrant-libvirt) # where the Ubuntu archive has them
fi
# make vagrant-box / vagrant-test only (scripts/vagrant-box.sh, vagrant-test.sh):
# libvirtd with its QEMU driver (not libvirt-daemon-system, which brings
# systemd and libvirt's default NAT network), the image tools, the bootloader.
if [[ $VAGRANT_HOST == yes ]]; then
    PKGS+=(libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients dnsmasq-base iptables
        qemu-utils dosfstools mtools syslinux syslinux-common fdisk)
fi
if [[ $PRINT_PACKAGES == yes ]]; then
    printf '%s\n' "${PKGS[@]}"
    exit 0
fi

missing=()
for p in "${PKGS[@]}"; do
    installed "$p" || missing+=("$p")
done
for p in "${VM_OPTIONAL[@]}"; do
    if ! installed "$p"; then
        if [[ ${#missing[@]} -gt 0 ]]; then apt_update_once; fi
        if available "$p"; then missing+=("$p"); fi
    fi
done
if [[ $OS_ID == ubuntu ]] && ! installed "linux-tools-$KREL"; then
    if [[ ${#missing[@]} -gt 0 ]]; then apt_update_once; fi
    if available "linux-tools-$KREL"; then missing+=("linux-tools-$KREL"); fi
fi
if [[ ${#missing[@]} -gt 0 ]]; then
    apt_install "${missing[@]}"
fi

for svc in memcached redis-server prometheus; do
    if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled --quiet "$svc" 2>/dev/null; then
        if [[ -d /run/systemd/system ]]; then
            as_root systemctl disable --now --quiet "$svc"
        else
            as_root systemctl disable --quiet "$svc" # no systemd running: just the boot links
        fi
        log "disabled the distribution's $svc service (tests start their own on free ports)"
    fi
done

# --- kernel headers for BCC --------------------------------------------------

# BCC compiles its programs against /lib/modules/$(uname -r)/build. Custom and
# cloud kernels have no headers package; then link the distribution's nearest
# one there. kvprof's BPF code reads only tracepoint fields and probe
# arguments, never kernel structs, so a version mismatch does not matter.
MODDIR=/lib/modules/$KREL
if [[ ! -e $MODDIR/build ]] && ! installed "linux-headers-$KREL"; then
    apt_update_once
    if available "linux-headers-$KREL"; then
        apt_install "linux-headers-$KREL"
    fi
fi
if [[ ! -e $MODDIR/build ]]; then
    if [[ $OS_ID == debian ]]; then meta=linux-headers-$ARCH; else meta=linux-headers-generic; fi
    flavour=${meta#linux-headers-} # amd64, arm64, generic
    # Prefer headers installed by an earlier run; otherwise what the meta package points at.
    hdr=$(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "linux-headers-*-$flavour" 2>/dev/null |
        awk '$2 == "installed" && $1 ~ /^linux-headers-[0-9]/ {print $1}' | sort -V | tail -n 1 || true)
    if [[ -z $hdr ]]; then
        apt_update_once
        hdr=$(apt-cache depends --important "$meta" 2>/dev/null |
            awk '$1 == "Depends:" && $2 ~ /^linux-headers-[0-9]/ {print $2}' | head -n 1 || true)
        [[ -n $hdr ]] || die "no linux-headers-$KREL and cannot resolve $meta: install kernel headers by hand"
        apt_install "$hdr"
    fi
    ver=${hdr#linux-headers-}
    build=$(readlink -f "/lib/modules/$ver/build" 2>/dev/null || true)
    [[ -d $build ]] || build=/usr/src/$hdr
    source=$(readlink -f "/lib/modules/$ver/source" 2>/dev/null || true)
    [[ -d $source ]] || source=$build
    [[ -d $build ]] || die "$hdr is installed but $build is missing"
    as_root mkdir -p "$MODDIR"
    as_root ln -sfn "$build" "$MODDIR/build"
    as_root ln -sfn "$source" "$MODDIR/source"
    log "no headers package for kernel $KREL: linked $hdr into $MODDIR/{build,source}"
fi

# --- tracefs and debugfs -----------------------------------------------------

mounted() { awk -v d="$1" '$2 == d {found = 1} END {exit !found}' /proc/mounts; }
if ! mounted /sys/kernel/tracing; then
    as_root mount -t tracefs tracefs /sys/kernel/tracing ||
        warn "could not mount tracefs on /sys/kernel/tracing: BPF tracepoints and uprobes will not work"
fi
if ! mounted /sys/kernel/debug; then
    as_root mount -t debugfs debugfs /sys/kernel/debug ||
        warn "could not mount debugfs on /sys/kernel/debug (BCC falls back to tracefs)"
fi

# --- Python: .venv on the distribution's Python --------------------------------

VENV=$REPO/.venv
venv_ok() {
    [[ -x $VENV/bin/python ]] &&
        grep -qx 'include-system-site-packages = true' "$VENV/pyvenv.cfg" 2>/dev/null &&
        [[ $(readlink -f "$VENV/bin/python") == "$(readlink -f "$PY")" ]]
}
if ! venv_ok; then
    if [[ -e $VENV ]]; then
        log "$VENV is not a --system-site-packages venv of $PY: recreating it"
        rm -rf "$VENV"
    fi
    "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PY is older than 3.11"
    log "creating $VENV from $PY (--system-site-packages, so BCC from python3-bpfcc imports)"
    as_user "$PY" -m venv --system-site-packages "$VENV"
fi

# pip runs only when pyproject.toml changed since the last successful install.
STAMP=$VENV/.kvprof-provisioned
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -x $VENV/bin/kvprof || $(cat "$STAMP" 2>/dev/null) != "$want" ]]; then
    log "pip install -e '.[dev]' into $VENV"
    # Never the PyPI package named `bcc` (an unrelated library): BCC is python3-bpfcc.
    as_user "$VENV/bin/pip" install --quiet --disable-pip-version-check -e '.[dev]'
    # shellcheck disable=SC2016  # $1/$2 belong to the inner sh
    as_user sh -c 'printf "%s\n" "$1" >"$2"' sh "$want" "$STAMP"
fi

# --- kvcached ------------------------------------------------------------------

if [[ $BUILD == no ]]; then
    log "--no-build: not building kvcached"
elif [[ -f server/Makefile ]]; then
    as_user make --no-print-directory -s -C server
    as_user make --no-print-directory -s -C server sanitize
else
    log "server/Makefile does not exist yet: skipping the kvcached build"
fi

# --- summary -----------------------------------------------------------------

if [[ -L $MODDIR/build && $(basename "$(readlink -f "$MODDIR/build")") != "linux-headers-$KREL" ]]; then
    headers="linked from $(basename "$(readlink -f "$MODDIR/build")")"
elif [[ -e $MODDIR/build ]]; then
    headers=matching
else
    headers=missing
fi

bcc_pkg=$(dpkg-query -W -f='${Version}' python3-bpfcc 2>/dev/null || true)
if bcc_ver=$("$VENV/bin/python" -c 'import bcc, sys; sys.stdout.write(getattr(bcc, "__version__", "?"))' 2>/dev/null); then
    bcc="BCC $bcc_ver"
elif [[ -n $bcc_pkg ]]; then
    bcc="BCC ${bcc_pkg%%+*} (not importable from .venv)"
else
    bcc="BCC missing"
fi

# `:u` so an ordinary user can count too (perf_event_paranoid 2 forbids kernel counting).
if ! command -v perf >/dev/null 2>&1; then
    pmu="unknown (no perf)"
elif out=$(perf stat -x, -e instructions:u true 2>&1 >/dev/null) && [[ $out != *"not supported"* && $out != *"not counted"* ]]; then
    pmu=yes
elif [[ $out == *"not supported"* || $out == *"not counted"* ]]; then
    pmu=no
else
    pmu="unknown (perf stat failed)"
fi

sockets=$(cat /sys/devices/system/cpu/cpu[0-9]*/topology/physical_package_id 2>/dev/null | sort -u | wc -l)

awk -v a="$START" -v b="$EPOCHREALTIME" 'BEGIN {printf "provision: took %.1f s\n", b - a}'
printf 'provision: ok: kernel %s, headers %s, %s, PMU %s, sockets %s\n' \
    "$KREL" "$headers" "$bcc" "$pmu" "$sockets"
