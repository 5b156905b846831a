# attack: read the host through the file system: /proc, /sys, /dev/mem, /dev/kvm, host secrets, escapes by .. and symlinks
# expect: ok
# must not: open any host path; the guest sees only the template's read-only image, its overlay and the VMM's synthetic /dev and /proc
import errno, os

refused = []
for path in [
    "/proc/self/mem", "/proc/kcore", "/proc/2/cmdline", "/proc/self/root", "/proc/self/ns", "/proc/sys/kernel/core_pattern",
    "/proc/self/task/2", "/proc/self/fd/100", "/proc/net", "/proc/mounts", "/proc/sysrq-trigger", "/proc/self/../2",
    "/sys/kernel", "/sys/class/net", "/dev/mem", "/dev/kmem", "/dev/port", "/dev/kvm", "/dev/sda",
    "/etc/shadow", "/root/.ssh/id_rsa", "/home", "/var/run/docker.sock", "/run",
    "/../../../../etc/shadow", "/tmp/../../proc/self/mem", "/work/../../../sys",
]:
    try:
        os.stat(path)
    except OSError as e:
        refused.append(e.errno)
        continue
    raise SystemExit(f"{path} exists in the guest")
# /proc is the VMM's: process 1 alone, the guest's own memory map (no host path in it), the
# VM's one CPU, and nothing in it writable.
assert os.listdir("/proc/self/task") == ["1"], os.listdir("/proc/self/task")
assert [n for n in os.listdir("/proc") if n.isdigit()] == ["1"], os.listdir("/proc")
for line in open("/proc/self/maps"):
    assert len(line.split()) == 5 or line.split()[5] in ("[heap]", "[stack]"), line
assert "Sandfork virtual CPU" in open("/proc/cpuinfo").read()
for path in ["/proc/self/status", "/proc/sys/kernel/hostname", "/proc/sys/vm/overcommit_memory"]:
    try:
        open(path, "w").write("x")
        raise SystemExit(f"{path} was writable")
    except OSError as e:
        assert e.errno == errno.EACCES, (path, e)
# A symlink in the writable overlay cannot point out of the VM either: through /proc it
# reaches the guest's own (synthetic) environment, elsewhere nothing.
os.symlink("/proc/self/environ", "/tmp/escape")
assert open("/tmp/escape", "rb").read() == open("/proc/self/environ", "rb").read()
os.remove("/tmp/escape")
os.symlink("/proc/self/root/etc/shadow", "/tmp/escape")
try:
    open("/tmp/escape").read()
    raise SystemExit("the symlink reached the host")
except OSError as e:
    assert e.errno == errno.ENOENT, e
os.remove("/tmp/escape")
assert set(refused) == {errno.ENOENT}, refused
print("contained")
