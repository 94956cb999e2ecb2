#!/usr/bin/env bash
# make vagrant-box: build a local libvirt Vagrant box of Debian 12 and add it
# to Vagrant as kvprof-local/debian12, for `make vagrant-test` (which boots the
# project's Vagrantfile with it: KVPROF_BOX=kvprof-local/debian12).
#
#   scripts/vagrant-box.sh [--rebuild]
#
# The box is what Vagrant expects of one: a qcow2 disk, metadata.json and a
# box Vagrantfile, with a `vagrant` user (password vagrant, sudo without a
# password) whose authorized_keys holds Vagrant's insecure public key, which
# `vagrant up` replaces with a key of its own the first time, as usual.
#
# Like `make vm-test`'s guest it is debootstrapped Debian 12 (bookworm, from
# this machine's Debian mirrors) with Debian's kernel, but a whole system:
# systemd, sshd, DHCP on every Ethernet link (systemd-networkd), a disk with
# a boot loader (syslinux on a small FAT partition, the root on ext4), so
# libvirt boots it like any box. Preinstalled, so that provisioning inside the
# guest runs offline (`make vagrant-test` gives the guest no way out):
#   - every system package scripts/provision.sh installs (it prints them with
#     --print-packages), and linux-headers for the box's kernel;
#   - the wheels of kvprof's Python dependencies (pyproject.toml, with [dev]) in
#     /opt/kvprof-wheels, with an /etc/pip.conf that installs from there only.
# scripts/provision.sh itself then runs inside the guest at `vagrant up`.
#
# Stages, each timed: rootfs (debootstrap), packages (apt-get in the rootfs),
# wheels (pip download on this machine), configure, image (ext4 + FAT + MBR,
# as qcow2), box (tar), add (vagrant box add). Nothing is mounted on the host
# (debootstrap mounts /proc and /sys in the rootfs while it runs; anything left
# mounted under the work folder is unmounted). The box is cached in
# build/vagrant and rebuilt when what it is made from changes (this script,
# provision's package list, pyproject.toml) or with --rebuild (README.md,
# "`vagrant up` for real", has the times and the box's size).
# `vagrant box remove kvprof-local/debian12` takes it out of Vagrant.
#
# Environment: KVPROF_VAGRANT_DIR (work folder, default build/vagrant),
# KVPROF_LOCAL_BOX (the box name). Needs root (debootstrap, chroot) and
# `scripts/provision.sh --vagrant` (qemu-img, syslinux, mtools, sfdisk).
set -euo pipefail

# shellcheck disable=SC2034  # read by vagrant-lib.sh
ME=vagrant-box
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/vagrant-lib.sh
. "$REPO/scripts/vagrant-lib.sh"

REBUILD=no
for arg in "$@"; do
    case "$arg" in
        --rebuild) REBUILD=yes ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *) die "unknown argument $arg (try --help)" ;;
    esac
done

[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap and chroot): run it with sudo"
[[ -x $REPO/.venv/bin/python ]] || die ".venv is missing: run make setup"
for tool in debootstrap chroot mkfs.ext4 mkfs.vfat mcopy syslinux sfdisk qemu-img vagrant; do
    command -v "$tool" >/dev/null || die "$tool is missing: run scripts/provision.sh --vagrant"
done
MBR=/usr/lib/syslinux/mbr/mbr.bin
[[ -f $MBR ]] || die "$MBR is missing: run scripts/provision.sh --vagrant"
INSECURE_KEY=$(gem contents vagrant 2>/dev/null | grep '/keys/vagrant\.pub$' | head -n 1 || true)
[[ -f $INSECURE_KEY ]] || die "cannot find Vagrant's insecure public key (keys/vagrant.pub in the vagrant gem)"

SUITE=bookworm
# Bump to rebuild the box when the way it is made changes in a way the key misses.
RECIPE=1
mkdir -p "$VAGRANT_WORK"
WORK=$(cd "$VAGRANT_WORK" && pwd)
ROOTFS=$WORK/rootfs
BOX=$WORK/kvprof-debian12.box
STAMP=$WORK/box.stamp

exec 9>"$WORK/.lock"
flock -n 9 || die "another vagrant-box or vagrant-test is running on $WORK"

# This machine's Debian mirrors, as apt sees them.
mirror() { apt-get indextargets --format '$(REPO_URI)' "Codename: $1" 2>/dev/null | head -n 1; }
MIRROR=$(mirror "$SUITE")
MIRROR=${MIRROR:-http://deb.debian.org/debian/}
SECURITY=$(mirror "$SUITE-security")
SECURITY=${SECURITY:-http://deb.debian.org/debian-security/}

mapfile -t PROVISION_PACKAGES < <(bash "$REPO/scripts/provision.sh" --print-packages)
[[ ${#PROVISION_PACKAGES[@]} -gt 0 ]] || die "scripts/provision.sh --print-packages printed nothing"
# What makes it a Vagrant box that boots on libvirt, besides provision's list.
BOX_PACKAGES=(systemd-sysv udev dbus kmod iproute2 openssh-server sudo rsync ca-certificates
    linux-image-amd64 linux-headers-amd64 python3)

KEY=$(
    cat "$0" "$REPO/pyproject.toml"
    printf '%s\n' "$RECIPE" "$SUITE" "$MIRROR" "$SECURITY" "${PROVISION_PACKAGES[*]}" "${BOX_PACKAGES[*]}"
) && KEY=$(sha256sum <<<"$KEY" | cut -d' ' -f1)

# --- cleanup ----------------------------------------------------------------------

cleanup() {
    local rc=$? m
    while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done < <(awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r)
    rm -rf --one-file-system "$ROOTFS" "$WORK/img" "$WORK/wheels"
    rm -f "$BOX.new"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

in_root() { chroot "$ROOTFS" env DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 "$@"; }

# --- stages -------------------------------------------------------------------------

make_rootfs() {
    rm -rf --one-file-system "$ROOTFS"
    if ! timeout 900 debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
        tail -n 30 "$WORK/debootstrap.log" >&2
        echo "(whole log: $WORK/debootstrap.log)" >&2
        return 1
    fi
}

install_packages() {
    rm -f "$ROOTFS/etc/apt/sources.list"
    local key=/usr/share/keyrings/debian-archive-keyring.gpg
    printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n\n' \
        "$MIRROR" "$SUITE $SUITE-updates" "$key" "$SECURITY" "$SUITE-security" "$key" \
        >"$ROOTFS/etc/apt/sources.list.d/debian.sources"
    # No service starts in the rootfs while packages install.
    printf '#!/bin/sh\nexit 101\n' >"$ROOTFS/usr/sbin/policy-rc.d"
    chmod 755 "$ROOTFS/usr/sbin/policy-rc.d"
    timeout 300 chroot "$ROOTFS" apt-get update -qq || return 1
    # linux-image-amd64 and linux-headers-amd64 from one index: the headers
    # match the kernel the box boots, so provision.sh finds them installed.
    if ! timeout 1800 chroot "$ROOTFS" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q -o Dpkg::Use-Pty=0 --no-install-recommends \
        "${BOX_PACKAGES[@]}" "${PROVISION_PACKAGES[@]}" >"$WORK/apt.log" 2>&1; then
        tail -n 30 "$WORK/apt.log" >&2
        echo "(whole log: $WORK/apt.log)" >&2
        return 1
    fi
    in_root apt-get clean
    rm -f "$ROOTFS/usr/sbin/policy-rc.d"
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/usr/share/{doc,man,info}/*
}

# The wheels pip would fetch from PyPI for `pip install -e '.[dev]'` (and the
# build backend pyproject.toml names), for the guest's Python: the same
# Debian 12 python3 as here.
download_wheels() {
    rm -rf "$WORK/wheels"
    local backend
    backend=$(awk -F'"' '/^requires *=/ {print $2; exit}' "$REPO/pyproject.toml")
    if ! "$REPO/.venv/bin/python" -m pip download --quiet --disable-pip-version-check \
        -d "$WORK/wheels" "${REPO}[dev]" "$backend" wheel >"$WORK/pip.log" 2>&1; then
        tail -n 20 "$WORK/pip.log" >&2
        return 1
    fi
    rm -f "$WORK"/wheels/kvprof-*
    mkdir -p "$ROOTFS/opt/kvprof-wheels"
    cp "$WORK"/wheels/* "$ROOTFS/opt/kvprof-wheels/"
    printf '[global]\n# kvprof-local box: offline, from the wheels the box was built with\nno-index = true\nfind-links = /opt/kvprof-wheels\n' \
        >"$ROOTFS/etc/pip.conf"
    log "$(find "$ROOTFS/opt/kvprof-wheels" -name '*.whl' | wc -l) wheels in /opt/kvprof-wheels"
}

configure() {
    local r=$ROOTFS
    # A host name that does not contain the Vagrantfile's ("kvprof"): Vagrant
    # adds that to /etc/hosts only when `grep -w` does not find it there.
    echo debian12 >"$r/etc/hostname"
    printf '127.0.0.1\tlocalhost\n127.0.1.1\tdebian12\n' >"$r/etc/hosts"
    # Not this machine's resolver (debootstrap copies its resolv.conf): no
    # DNS server at all, so the guest never sends a query (it needs none).
    printf '# kvprof-local box: no DNS server (it installs nothing from the network)\n' >"$r/etc/resolv.conf"
    printf 'LABEL=kvprof-root / ext4 errors=remount-ro 0 1\n' >"$r/etc/fstab"
    # DHCP on whatever Ethernet link the provider gives (libvirt: virtio-net).
    cat >"$r/etc/systemd/network/80-dhcp.network" <<'EOF'
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
EOF
    in_root systemctl enable --quiet systemd-networkd
    # Host keys of its own for every machine made from the box, at first boot.
    rm -f "$r"/etc/ssh/ssh_host_*
    cat >"$r/etc/systemd/system/kvprof-ssh-hostkeys.service" <<'EOF'
[Unit]
Description=Generate this machine's SSH host keys
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=ssh.service
EOF
    in_root systemctl enable --quiet kvprof-ssh-hostkeys.service
    # A machine id of its own too (systemd writes one at first boot).
    : >"$r/etc/machine-id"
    rm -f "$r/var/lib/dbus/machine-id"
    # The vagrant user, as Vagrant expects of a box.
    in_root useradd -m -s /bin/bash vagrant
    echo vagrant:vagrant | in_root chpasswd
    printf 'vagrant ALL=(ALL) NOPASSWD: ALL\nDefaults:vagrant !requiretty\n' >"$r/etc/sudoers.d/vagrant"
    chmod 440 "$r/etc/sudoers.d/vagrant"
    install -d -m 700 "$r/home/vagrant/.ssh"
    install -m 600 "$INSECURE_KEY" "$r/home/vagrant/.ssh/authorized_keys"
    in_root chown -R vagrant:vagrant /home/vagrant/.ssh
}

make_image() {
    local img=$WORK/img kver root_mb fat_mb=128
    rm -rf "$img"
    mkdir -p "$img"
    kver=$(find "$ROOTFS/boot" -name 'vmlinuz-*' -printf '%f\n' | sed 's/^vmlinuz-//' | sort -V | tail -n 1)
    [[ -n $kver && -f $ROOTFS/boot/initrd.img-$kver ]] || {
        echo "no kernel and initrd in the rootfs's /boot" >&2
        return 1
    }
    # Boot partition: FAT with syslinux, the kernel and its initrd.
    cat >"$img/syslinux.cfg" <<EOF
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  LINUX /vmlinuz
  INITRD /initrd.img
  APPEND root=LABEL=kvprof-root ro console=tty0 console=ttyS0,115200 mitigations=off
EOF
    mkfs.vfat -n KVBOOT -C "$img/boot.fat" $((fat_mb * 1024)) >/dev/null
    mcopy -i "$img/boot.fat" "$ROOTFS/boot/vmlinuz-$kver" ::/vmlinuz
    mcopy -i "$img/boot.fat" "$ROOTFS/boot/initrd.img-$kver" ::/initrd.img
    mcopy -i "$img/boot.fat" "$img/syslinux.cfg" ::/syslinux.cfg
    syslinux --install "$img/boot.fat"
    # Root partition: the rootfs plus room for the guest's .venv and builds.
    root_mb=$(($(du -sm "$ROOTFS" | cut -f1) + 3072))
    mkfs.ext4 -q -F -L kvprof-root -d "$ROOTFS" "$img/root.ext4" "${root_mb}M"
    # The disk: MBR (syslinux's boot code), FAT from 1 MiB, ext4 after it.
    truncate -s $((1 + fat_mb + root_mb))M "$img/disk.raw"
    printf 'label: dos\nstart=1MiB, size=%sMiB, type=c, bootable\nstart=%sMiB, type=83\n' \
        "$fat_mb" $((1 + fat_mb)) | sfdisk -q "$img/disk.raw"
    dd if="$MBR" of="$img/disk.raw" bs=440 count=1 conv=notrunc status=none
    dd if="$img/boot.fat" of="$img/disk.raw" bs=1M seek=1 conv=notrunc status=none
    dd if="$img/root.ext4" of="$img/disk.raw" bs=1M seek=$((1 + fat_mb)) conv=notrunc status=none
    qemu-img convert -c -O qcow2 "$img/disk.raw" "$img/box.img"
    rm -f "$img/disk.raw" "$img/root.ext4" "$img/boot.fat"
    echo "$kver" >"$img/kernel"
}

make_box() {
    local img=$WORK/img gb
    gb=$(qemu-img info --output=json "$img/box.img" | python3 -c 'import json, sys; print(-(-json.load(sys.stdin)["virtual-size"] // 2**30))')
    printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": %s}\n' "$gb" >"$img/metadata.json"
    cat >"$img/Vagrantfile" <<'EOF'
# kvprof-local/debian12, built by scripts/vagrant-box.sh (make vagrant-box).
Vagrant.configure("2") do |config|
  config.vm.provider "libvirt" do |lv|
    lv.disk_bus = "virtio"
  end
end
EOF
    echo "$KEY" >"$img/kvprof-box.stamp"
    tar -c -f "$BOX.new" -C "$img" metadata.json Vagrantfile box.img kvprof-box.stamp
    mv "$BOX.new" "$BOX"
    echo "$KEY" >"$STAMP"
    log "box $BOX: $(du -h "$BOX" | cut -f1), Debian $SUITE, kernel $(cat "$img/kernel"), disk ${gb} GiB"
}

# The box Vagrant has under our name, if it is the one this key makes.
added_stamp() {
    local home=${VAGRANT_HOME:-$HOME/.vagrant.d}
    cat "$home/boxes/${KVPROF_LOCAL_BOX//\//-VAGRANTSLASH-}/0/libvirt/kvprof-box.stamp" 2>/dev/null || true
}

add_box() {
    vagrant_global box add --force --name "$KVPROF_LOCAL_BOX" "$BOX"
}

T0=$EPOCHREALTIME
if [[ $REBUILD == no && -f $BOX && $(cat "$STAMP" 2>/dev/null) == "$KEY" ]]; then
    log "box up to date: $BOX (--rebuild to make it anew)"
else
    log "building $BOX: Debian $SUITE from $MIRROR"
    step rootfs make_rootfs
    step packages install_packages
    step wheels download_wheels
    step configure configure
    step image make_image
    step box make_box
fi
if [[ $(added_stamp) == "$KEY" ]]; then
    log "Vagrant already has this box as $KVPROF_LOCAL_BOX"
else
    step add add_box
fi
log "ok in $(seconds_since "$T0") s${TIMES:+ ($(times_line))}: $KVPROF_LOCAL_BOX"
