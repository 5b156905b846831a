#!/usr/bin/env bash
# Can this machine's /dev/kvm create a VM with a vCPU? Prints "ok", "absent", or why not
# ("cannot create a VM: ..."), and exits 0 either way. scripts/kvm-tier.sh and
# scripts/setup-debian.sh choose the KVM tier's path with it: native when "ok", else QEMU.
# Needs Debian's /usr/bin/python3 (installed by scripts/setup-debian.sh).
set -u
[ -e /dev/kvm ] || { echo absent; exit 0; }
[ -x /usr/bin/python3 ] || { echo "cannot probe /dev/kvm: /usr/bin/python3 is missing (scripts/setup-debian.sh installs it)"; exit 0; }
/usr/bin/python3 - <<'PY' 2>&1
import fcntl, os
KVM_GET_API_VERSION, KVM_CREATE_VM, KVM_CREATE_VCPU = 0xAE00, 0xAE01, 0xAE41
try:
    kvm = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    version = fcntl.ioctl(kvm, KVM_GET_API_VERSION, 0)
    if version != 12:
        raise OSError(f"KVM API version {version}, expected 12")
    vm = fcntl.ioctl(kvm, KVM_CREATE_VM, 0)
    fcntl.ioctl(vm, KVM_CREATE_VCPU, 0)
    print("ok")
except OSError as e:
    print(f"cannot create a VM: {e}")
PY
exit 0
