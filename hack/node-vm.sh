#!/usr/bin/env bash
# A Debian 12 node VM: systemd as PID 1, a pure cgroup v2 hierarchy, Debian's kernel.
#   hack/node-vm.sh image          builds the base disk once (from hack/fresh-root.sh's root plus
#                                  the kernel, udev, the CNI plugins) and caches it under
#                                  $BERTH_CACHE/node-vm; prints its directory
#   hack/node-vm.sh run SHARE [SECS]
#                                  boots a throw-away copy (qcow2 over the base) with SHARE as a
#                                  9p share at /mnt/share; the guest runs SHARE/guest.sh once at
#                                  boot (its output in SHARE/guest.log, its exit status in
#                                  SHARE/guest.rc) and powers off. Exits with guest.rc; 124 when
#                                  the guest did not finish in SECS (default 900). A guest.sh that
#                                  leaves SHARE/reboot behind gets a reboot and runs again.
# KVM when /dev/kvm is usable, software emulation otherwise.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cache=${BERTH_CACHE:-/var/cache/berth}/node-vm
mirror=${BERTH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# Bump when the guest's contents change, so a cached disk is rebuilt.
version=3

need() {
  command -v "$1" >/dev/null || apt-get install -y --no-install-recommends "$2" >&2
}

build_image() {
  if [ -s "$cache/base-$version.img" ] && [ -s "$cache/vmlinuz" ] && [ -s "$cache/initrd.img" ]; then
    return
  fi
  need mkfs.ext4 e2fsprogs
  mkdir -p "$cache"
  build=$(mktemp -d /var/tmp/berth-node-vm.XXXXXX)
  root=$build/root
  cleanup() {
    for m in dev/pts dev sys proc; do umount "$root/$m" 2>/dev/null || true; done
    rm -rf "$build"
  }
  trap cleanup EXIT
  bash "$top/hack/fresh-root.sh" "$root" >&2
  mount -t proc proc "$root/proc"
  mount -t sysfs sys "$root/sys"
  mount --bind /dev "$root/dev"
  mount --bind /dev/pts "$root/dev/pts"
  echo "deb $mirror bookworm main" >"$root/etc/apt/sources.list"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  chroot "$root" /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get update -q && apt-get install -y -q --no-install-recommends \
      linux-image-amd64 systemd-sysv udev kmod iproute2 containernetworking-plugins \
      ca-certificates procps jq dbus apparmor' >&2
  chroot "$root" apt-get clean >&2
  for m in dev/pts dev sys proc; do umount "$root/$m"; done
  # The 9p share and its modules in the initramfs are not needed: it is mounted after boot.
  echo node-vm >"$root/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 node-vm\n' >"$root/etc/hosts"
  printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\nshare /mnt/share 9p trans=virtio,version=9p2000.L,msize=262144,nofail 0 0\n' \
    >"$root/etc/fstab"
  mkdir -p "$root/mnt/share"
  echo 'root:berth' | chroot "$root" chpasswd
  mkdir -p "$root/etc/systemd/network"
  printf '[Match]\nName=en*\n\n[Network]\nDHCP=yes\n' >"$root/etc/systemd/network/10-user.network"
  ln -sf /lib/systemd/system/systemd-networkd.service \
    "$root/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
  rm -f "$root/etc/resolv.conf"
  printf 'nameserver 10.0.2.3\n' >"$root/etc/resolv.conf"
  cat >"$root/etc/systemd/system/berth-guest.service" <<'EOF'
[Unit]
Description=Runs the host's guest.sh from the 9p share, then powers off or reboots
After=network-online.target mnt-share.mount
Wants=network-online.target
RequiresMountsFor=/mnt/share

[Service]
Type=oneshot
StandardOutput=journal+console
ExecStart=/bin/sh -c 'cd /mnt/share && rm -f reboot && { bash ./guest.sh >>guest.log 2>&1; echo $? >guest.rc; }; sync; if [ -e reboot ]; then rm -f guest.rc; systemctl reboot; else systemctl poweroff; fi'

[Install]
WantedBy=multi-user.target
EOF
  ln -sf /etc/systemd/system/berth-guest.service \
    "$root/etc/systemd/system/multi-user.target.wants/berth-guest.service"
  cp "$root"/boot/vmlinuz-* "$build/vmlinuz"
  cp "$root"/boot/initrd.img-* "$build/initrd.img"
  rm -f "$cache"/base-*.img
  mkfs.ext4 -q -F -L node-vm -d "$root" "$build/base.img" 4G >&2
  mv "$build/vmlinuz" "$cache/vmlinuz"
  mv "$build/initrd.img" "$cache/initrd.img"
  mv "$build/base.img" "$cache/base-$version.img"
}

run_vm() {
  local share secs
  share=$(cd "$1" && pwd)
  secs=${2:-900}
  need qemu-system-x86_64 qemu-system-x86
  need qemu-img qemu-utils
  build_image
  local disk=$share/disk.qcow2
  qemu-img create -q -f qcow2 -F raw -b "$cache/base-$version.img" "$disk" 8G
  local accel=(-accel tcg -cpu max)
  if [ -w /dev/kvm ] && grep -qE 'vmx|svm' /proc/cpuinfo; then
    accel=(-accel kvm -cpu host)
  fi
  rm -f "$share/guest.rc"
  local rc=0
  timeout --foreground "$secs" qemu-system-x86_64 "${accel[@]}" -m 3072 -smp 2 -nographic \
    -kernel "$cache/vmlinuz" -initrd "$cache/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 quiet" \
    -drive "file=$disk,if=virtio,format=qcow2" \
    -virtfs "local,path=$share,mount_tag=share,security_model=none,id=share" \
    -nic user,model=virtio-net-pci \
    -serial "file:$share/console.log" -monitor none -display none </dev/null || rc=$?
  rm -f "$disk"
  if [ "$rc" = 124 ]; then
    echo "node-vm: the guest did not finish in ${secs}s (console: $share/console.log)" >&2
    return 124
  fi
  if [ ! -s "$share/guest.rc" ]; then
    echo "node-vm: the guest stopped without a result (qemu $rc; console: $share/console.log)" >&2
    return 125
  fi
  return "$(cat "$share/guest.rc")"
}

case ${1:-} in
  image) build_image; echo "$cache" ;;
  run) shift; run_vm "$@" ;;
  *) echo "usage: hack/node-vm.sh image | run SHARE [SECS]" >&2; exit 2 ;;
esac
