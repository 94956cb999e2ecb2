#!/bin/busybox sh
# shellcheck shell=sh
# /init of the initrd that scripts/vm-test.sh makes for its two-socket guest.
# Debian's kernel has virtio and ext4 as modules, so this loads them (busybox
# modprobe over the modules vm-test.sh copied in), mounts the rootfs from the
# first disk, unpacks the payload (this checkout's kvprof with its probes, kvcached and
# kvload, as a tar on the second disk) into it, and hands over to
# scripts/vm-guest-init.sh. The rootfs disk is opened with snapshot=on, so
# nothing written here reaches the cached image.
/bin/busybox --install -s /bin
ln -sf /bin/busybox /sbin/modprobe
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

fail() {
    echo "VMTEST initrd: $*"
    echo o >/proc/sysrq-trigger
    sleep 60
}

for m in virtio_pci virtio_blk crc32c_generic ext4; do
    modprobe "$m" 2>/dev/null || echo "VMTEST initrd: modprobe $m failed (built in?)"
done
i=0
while [ ! -b /dev/vdc ] && [ "$i" -lt 200 ]; do
    sleep 0.05
    i=$((i + 1))
done
[ -b /dev/vdc ] || fail "virtio disks did not appear"
mount -t ext4 /dev/vda /newroot || fail "cannot mount the rootfs"
mkdir -p /newroot/opt/kvprof
tar -x -f /dev/vdb -C /newroot/opt/kvprof || fail "cannot unpack the payload from /dev/vdb"

# The rootfs has no iproute2 (nothing else needs it): bring loopback up here,
# the network namespace survives switch_root.
ip link set lo up

umount /proc /sys
mount --move /dev /newroot/dev
# Through bash, so the mode bits of the checkout do not matter.
exec switch_root /newroot /bin/bash /opt/kvprof/scripts/vm-guest-init.sh
