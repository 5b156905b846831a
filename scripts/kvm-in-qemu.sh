#!/usr/bin/env bash
# kvm-in-qemu.sh -- run one command as root on a machine that has a working /dev/kvm, when this
# one has none: inside a QEMU guest whose CPU is emulated (TCG, never /dev/kvm) with AMD SVM and
# nested paging, booting Debian's own kernel, which loads kvm_amd.
#
#   scripts/kvm-in-qemu.sh [options] [--] CMD [ARGS...]
#
# The guest sees the host's root file system read-only over 9p with a RAM-backed overlay on top
# (it can write anywhere; what it writes is discarded at exit) and has a loopback interface and
# no other network. It runs CMD chrooted there in the current directory, streams CMD's stdout and stderr to ours and exits with CMD's exit code.
# The KVM tier (scripts/kvm-tier.sh) boots it once to run all program tests in it.
#
# options:
#   -w DIR      share DIR read-write at the same path, to keep results (repeatable). Unix
#               sockets cannot be bound on a 9p share (ENXIO): keep sockets and scratch
#               directories off it (anywhere else is the RAM overlay, where they work).
#   -e NAME=VAL set an environment variable for CMD (repeatable). CMD otherwise gets PATH,
#               HOME=/root, TERM=dumb, LANG=C.UTF-8 and the caller's RUST_BACKTRACE/RUST_LOG.
#   -t SECS     wall-clock limit for the whole run (default 1800); exit code 124 on expiry
#   -m SIZE     guest memory (default 4G; the overlay may use up to 75% of it)
#   -s N        guest vCPUs (default 1; each is one host thread of QEMU's multi-threaded TCG)
#   -c CPU      QEMU CPU model (default max; EPYC,+svm and qemu64,+svm work too). QEMU's TCG
#               emulates AMD SVM only: Intel VMX (+vmx) is refused.
#   -o OPTS     kvm_amd module options (e.g. "npt=0"); default none (nested paging on)
#   -k KERNEL   kernel image (default: the newest /boot/vmlinuz-* that has its /lib/modules)
#   -v          copy the guest console (kernel log) to stderr as it is written
#   -n          check only: verify the prerequisites, print "RELEASE VERSION" of the kernel that
#               would boot (e.g. "6.1.0-57-amd64 6.1.192") and exit 0
#   -h          this help
#
# exit codes: CMD's own; 124 timeout; 125 setup error (a missing package, boot failure, kvm_amd
# failed to load; the reason is on stderr).
#
# Needs (Debian 12 packages, installed by scripts/setup-debian.sh where /dev/kvm is unusable):
# qemu-system-x86, linux-image-amd64 (the cloud kernel lacks 9p), busybox-static, cpio, kmod,
# xz-utils. Runs as root (the 9p export of / and root inside the guest). Measured on a 2-core
# machine: boot to CMD ~4 s, guest code ~13x slower than native, a VM exit ~60 us, ~430 MB RSS.
# Caches the kernel's uncompressed vmlinux (PVH boot skips BIOS and decompression, ~2x faster)
# in $KIQ_CACHE (default /var/tmp/kvm-in-qemu).
set -u -o pipefail

die() { echo "kvm-in-qemu: $*" >&2; exit 125; }

RW=() ENVS=() TIMEOUT=1800 MEM=4G SMP=1 CPU=max MODOPT= KERNEL= VERBOSE=0 CHECK_ONLY=0
while getopts "w:e:t:m:s:c:o:k:vnh" opt; do
  case $opt in
    w) RW+=("$OPTARG") ;;
    e) [[ $OPTARG == [A-Za-z_]*=* ]] || die "-e wants NAME=VALUE, got '$OPTARG'"; ENVS+=("$OPTARG") ;;
    t) TIMEOUT=$OPTARG ;;  m) MEM=$OPTARG ;;  s) SMP=$OPTARG ;;  c) CPU=$OPTARG ;;
    o) MODOPT=$OPTARG ;;   k) KERNEL=$OPTARG ;; v) VERBOSE=1 ;;  n) CHECK_ONLY=1 ;;
    h) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "bad option (see -h)" ;;
  esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || [ $CHECK_ONLY = 1 ] || die "usage: kvm-in-qemu.sh [options] [--] CMD [ARGS...] (see -h)"
[ "$(id -u)" = 0 ] || die "must run as root"

# ---- prerequisites ---------------------------------------------------------------------------
missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
# busybox-static: the initramfs has no libraries, so /bin/busybox must be a static executable.
{ [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; } || missing+=(busybox-static)
command -v cpio >/dev/null || missing+=(cpio)
command -v modprobe >/dev/null || missing+=(kmod)
command -v xz >/dev/null || missing+=(xz-utils)
if [ -z "$KERNEL" ]; then
  for k in $(ls -1v /boot/vmlinuz-* 2>/dev/null | tac); do
    [ -d "/lib/modules/${k#/boot/vmlinuz-}/kernel" ] && { KERNEL=$k; break; }
  done
  [ -n "$KERNEL" ] || missing+=(linux-image-amd64)
fi
[ ${#missing[@]} = 0 ] || die "missing packages; install them with: apt-get install -y ${missing[*]} (or run scripts/setup-debian.sh)"
[ -r "$KERNEL" ] || die "kernel $KERNEL is not readable"
KVER=${KERNEL##*/vmlinuz-}
MODDIR=/lib/modules/$KVER
[ -d "$MODDIR/kernel" ] || die "no modules for kernel $KVER in $MODDIR (install linux-image-$KVER)"
for m in kvm_amd 9p 9pnet_virtio overlay; do
  modprobe -S "$KVER" --show-depends "$m" >/dev/null 2>&1 || die "kernel $KVER has no $m module (the cloud kernel lacks 9p: install linux-image-amd64)"
done

if [ $CHECK_ONLY = 1 ]; then
  # The bzImage header's kernel_version string (offset 0x20E points to it, less 0x200):
  # "6.1.0-57-amd64 (...) #1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (...)".
  ptr=$(od -An -tu2 -j $((0x20E)) -N2 "$KERNEL" | tr -d ' ')
  banner=$(dd if="$KERNEL" bs=1 skip=$((ptr + 0x200)) count=256 2>/dev/null | tr '\0' '\n' | head -1)
  version=$(sed -n 's/.* Debian \([0-9][0-9.]*\)[-+~].*/\1/p' <<<"$banner")
  echo "$KVER ${version:-$KVER}"
  exit 0
fi

for d in "${RW[@]+"${RW[@]}"}"; do
  [ -d "$d" ] || die "-w $d: not a directory"
done
for i in "${!RW[@]}"; do
  RW[$i]=$(cd "${RW[$i]}" && pwd -P)
  case ${RW[$i]} in
    /) die "refusing to share / read-write" ;;
    *[[:space:]]*) die "-w path with spaces is not supported: ${RW[$i]}" ;;
  esac
done

# ---- the kernel to boot: the uncompressed vmlinux when it has a PVH entry note, else vmlinuz --
CACHE=${KIQ_CACHE:-/var/tmp/kvm-in-qemu}
mkdir -p "$CACHE" || die "cannot create cache dir $CACHE"
BOOTK=$KERNEL
VMLINUX=$CACHE/vmlinux-$KVER
if { [ ! -s "$VMLINUX" ] || [ "$VMLINUX" -ot "$KERNEL" ]; } && [ ! -e "$VMLINUX.nopvh" ]; then
  tmp=$VMLINUX.tmp.$$
  off=$(LC_ALL=C grep -aobUP -m1 '\xfd7zXZ\x00' "$KERNEL" 2>/dev/null | head -1 | cut -d: -f1)
  # xz stops with an error at the data after the stream; what it wrote before is complete.
  if [ -n "$off" ] && { tail -c +$((off + 1)) "$KERNEL" | xz -dc > "$tmp" 2>/dev/null; [ -s "$tmp" ]; } \
     && readelf -n "$tmp" 2>/dev/null | grep -q 'Xen.*0x00000012\|Unknown note type: (0x00000012)'; then
    mv -f "$tmp" "$VMLINUX"
  else
    rm -f "$tmp"; : > "$VMLINUX.nopvh"
  fi
fi
[ -s "$VMLINUX" ] && BOOTK=$VMLINUX

# ---- job directory: $JOB/share is the guest's "job" share; the FIFOs stay on the host ---------
JOB=$(mktemp -d "${TMPDIR:-/tmp}/kiq.XXXXXX") || die "mktemp failed"
SH=$JOB/share; mkdir -p "$SH"
QPID= TAILPID= CATS=()
cleanup() {
  [ -n "$QPID" ] && kill "$QPID" 2>/dev/null
  [ -n "$TAILPID" ] && kill "$TAILPID" 2>/dev/null
  for p in "${CATS[@]+"${CATS[@]}"}"; do kill "$p" 2>/dev/null; done
  rm -rf "$JOB"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- initramfs: static busybox and the modules that mount 9p and overlayfs --------------------
IR=$JOB/initramfs; mkdir -p "$IR"/{bin,mods,proc,sys,dev,job,lower,upper,newroot}
cp /bin/busybox "$IR/bin/busybox"
: > "$IR/mods/order"
for m in virtio_pci 9pnet_virtio 9p overlay; do
  modprobe -S "$KVER" --show-depends "$m" 2>/dev/null | while read -r kind path _; do
    [ "$kind" = insmod ] || continue
    b=$(basename "$path"); [ -e "$IR/mods/$b" ] && continue
    case $path in
      *.ko) cp "$path" "$IR/mods/$b" ;;
      *.ko.xz) xz -dc "$path" > "$IR/mods/${b%.xz}"; b=${b%.xz} ;;
      *.ko.zst) zstd -qdc "$path" > "$IR/mods/${b%.zst}"; b=${b%.zst} ;;
      *.ko.gz) gzip -dc "$path" > "$IR/mods/${b%.gz}"; b=${b%.gz} ;;
    esac
    echo "$b" >> "$IR/mods/order"
  done
done
# Serial ports: ttyS0 the console (kernel log), ttyS1 CMD's stdout, ttyS2 CMD's stderr.
cat > "$IR/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
log() { echo "kiq-init: $*" > /dev/ttyS0; }
fail() { log "FATAL: $*"; echo "kvm-in-qemu (guest): $*" > /dev/ttyS2; echo 125 > /job/rc 2>/dev/null; sync; reboot -f; }
stty -F /dev/ttyS1 raw -echo; stty -F /dev/ttyS2 raw -echo
for m in $(cat /mods/order); do
  insmod /mods/$m 2>/dev/null || grep -q "^$(echo ${m%.ko} | tr - _) " /proc/modules || log "insmod $m failed"
done
O9="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o $O9,cache=none job /job || fail "cannot mount the job share"
. /job/config
mount -t 9p -o $O9,ro,cache=loose root /lower || fail "cannot mount the host root"
mount -t tmpfs -o size=75% tmpfs /upper; mkdir -p /upper/u /upper/w
mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w overlay /newroot \
  || fail "cannot mount overlayfs over the host root"
mount -t proc proc /newroot/proc; mount -t sysfs sys /newroot/sys; mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
# What udev would make: bash's process substitution and /dev/stdin users need them.
ln -sf /proc/self/fd /newroot/dev/fd; ln -sf /proc/self/fd/0 /newroot/dev/stdin
ln -sf /proc/self/fd/1 /newroot/dev/stdout; ln -sf /proc/self/fd/2 /newroot/dev/stderr
mount -t devpts devpts /newroot/dev/pts; mount -t tmpfs tmpfs /newroot/dev/shm; mount -t tmpfs tmpfs /newroot/run
i=0
for d in $KIQ_RW; do
  mkdir -p /newroot$d && mount -t 9p -o $O9,cache=none rw$i /newroot$d || fail "cannot mount read-write share $d"
  i=$((i+1))
done
mkdir -p /newroot/run/kiq && mount --move /job /newroot/run/kiq
# Loopback only (no other network): servers the command starts listen on 127.0.0.1.
ip link set lo up 2>/dev/null || log "cannot bring up the loopback interface"
log "running command (uptime $(cut -d' ' -f1 /proc/uptime))"
chroot /newroot /bin/bash /run/kiq/stage2.sh < /dev/null > /dev/ttyS1 2> /dev/ttyS2
rc=$?
log "command exited rc=$rc (uptime $(cut -d' ' -f1 /proc/uptime))"
echo $rc > /newroot/run/kiq/rc
sync
reboot -f
EOF
chmod +x "$IR/init"
(cd "$IR" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$SH/initrd.gz") || die "building the initramfs failed"
rm -rf "$IR"

# ---- config (sourced by busybox sh in the initramfs) and stage 2 (the host's bash, chrooted) --
printf 'KIQ_RW="%s"\n' "${RW[*]+"${RW[*]}"}" > "$SH/config"
{
  echo 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb LANG=C.UTF-8'
  for v in RUST_BACKTRACE RUST_LOG; do [ -n "${!v:-}" ] && printf 'export %s=%q\n' "$v" "${!v}"; done
  for e in "${ENVS[@]+"${ENVS[@]}"}"; do printf 'export %s=%q\n' "${e%%=*}" "${e#*=}"; done
  printf 'if ! out=$(modprobe kvm_amd %s 2>&1) || [ ! -c /dev/kvm ]; then\n' "$MODOPT"
  echo '  echo "kvm-in-qemu (guest): loading kvm_amd failed: $out" >&2; dmesg | grep -i -E "kvm|svm" | tail -5 >&2; exit 125'
  echo 'fi'
  # The kernel cannot load a module on demand from the chroot (its helper runs in the
  # initramfs): the tests' network namespaces need veth loaded ahead.
  echo 'modprobe veth 2>/dev/null || true'
  printf 'cd %q 2>/dev/null || cd /\n' "$PWD"
  printf 'exec'; printf ' %q' "$@"; printf '\n'
} > "$SH/stage2.sh"

# ---- boot ---------------------------------------------------------------------------------------
args=(-accel tcg -cpu "$CPU" -m "$MEM" -smp "$SMP" -nodefaults -no-user-config -display none -no-reboot
  -kernel "$BOOTK" -initrd "$SH/initrd.gz"
  -append "console=ttyS0 panic=-1 loglevel=5 mitigations=off"
  -serial "file:$JOB/console.log"
  -chardev "file,id=out,path=$JOB/out.fifo" -serial chardev:out
  -chardev "file,id=err,path=$JOB/err.fifo" -serial chardev:err
  -fsdev "local,id=fsroot,path=/,security_model=none,readonly=on,multidevs=remap"
  -device "virtio-9p-pci,fsdev=fsroot,mount_tag=root"
  -fsdev "local,id=fsjob,path=$SH,security_model=none" -device "virtio-9p-pci,fsdev=fsjob,mount_tag=job")
for i in "${!RW[@]}"; do
  args+=(-fsdev "local,id=fsrw$i,path=${RW[$i]},security_model=passthrough,multidevs=remap"
         -device "virtio-9p-pci,fsdev=fsrw$i,mount_tag=rw$i")
done
: > "$JOB/console.log"
mkfifo "$JOB/out.fifo" "$JOB/err.fifo" || die "mkfifo failed"
cat "$JOB/out.fifo" & CATS+=($!)
cat "$JOB/err.fifo" >&2 & CATS+=($!)
if [ $VERBOSE = 1 ]; then tail -n +1 -f "$JOB/console.log" >&2 & TAILPID=$!; fi
timeout --kill-after=10 "$TIMEOUT" qemu-system-x86_64 "${args[@]}" < /dev/null 2> "$JOB/qemu.err" &
QPID=$!
wait "$QPID"; qrc=$?; QPID=
# QEMU may have died before opening a FIFO: a read-write open never blocks and releases a cat
# still waiting in open(); once it is closed again every cat sees EOF after draining.
exec 3<>"$JOB/out.fifo" 4<>"$JOB/err.fifo"; exec 3>&- 4>&-
wait "${CATS[@]}" 2>/dev/null; CATS=()
[ -n "$TAILPID" ] && { sleep 0.2; kill "$TAILPID" 2>/dev/null; TAILPID=; }
if [ -s "$SH/rc" ]; then
  exit "$(cat "$SH/rc")"
fi
if [ $qrc = 124 ] || [ $qrc = 137 ]; then
  echo "kvm-in-qemu: timed out after ${TIMEOUT}s" >&2; tail -5 "$JOB/console.log" >&2; exit 124
fi
echo "kvm-in-qemu: the guest stopped without an exit code (qemu rc=$qrc)" >&2
grep -v "TCG doesn't support requested feature" "$JOB/qemu.err" | tail -5 >&2
tail -20 "$JOB/console.log" >&2
exit 125
