# attack: read the host through the file system: /proc, /sys, /dev/mem, /dev/kvm, host secrets, escapes by .. and symlinks
# expect: ok
# must not: open any host path; the guest sees only the template's read-only image and its overlay
import errno, os

refused = []
for path in [
    "/proc/self/maps", "/proc/self/mem", "/proc/self/environ", "/proc/1/cmdline", "/proc/cpuinfo",
    "/sys/kernel", "/sys/class/net", "/dev/mem", "/dev/kmem", "/dev/port", "/dev/kvm", "/dev/sda",
    "/etc/shadow", "/root/.ssh/id_rsa", "/home", "/var/run/docker.sock", "/run",
    "/../../../../etc/shadow", "/tmp/../../proc/self/maps", "/work/../../../sys",
]:
    try:
        os.stat(path)
    except OSError as e:
        refused.append(e.errno)
        continue
    raise SystemExit(f"{path} exists in the guest")
# A symlink in the writable overlay cannot point out of the VM either.
os.symlink("/proc/self/environ", "/tmp/escape")
try:
    open("/tmp/escape").read()
    raise SystemExit("the symlink reached /proc")
except OSError as e:
    assert e.errno == errno.ENOENT, e
os.remove("/tmp/escape")
assert set(refused) == {errno.ENOENT}, refused
print("contained")
