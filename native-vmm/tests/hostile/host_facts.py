# attack: read what the host is: its boot time and uptime (/proc/uptime, /proc/stat btime, the monotonic and boot clocks) and the host CPU a vCPU last ran on (rdtscp's TSC_AUX), and ask for AMX tile state the VMM does not keep
# expect: ok
# expect-variants: cpu_number=ok|error
# expect-off-pvm: cpu_number=ok
# (on PVM, rdtscp at CPL3 reads the host's own TSC_AUX whatever the vCPU's MSR says: docs/security.md)
# variants: clocks cpu_number amx
# must not: show the host's boot time or uptime, show the host's CPU number where CPUID and RDTSCP trap, or grant AMX tile data (its state would be lost at the next switch)
import ctypes, errno, mmap, sys, time

GUEST_BOOT_EPOCH_S = 1_767_225_600  # the VMM's GUEST_BOOT_EPOCH_S
variant = sys.argv[1]

if variant == "clocks":
    uptime = float(open("/proc/uptime").read().split()[0])
    btime = next(int(l.split()[1]) for l in open("/proc/stat") if l.startswith("btime "))
    assert abs(btime - GUEST_BOOT_EPOCH_S) <= 2, f"btime {btime} is not the guest's boot"
    assert abs(uptime - time.clock_gettime(time.CLOCK_BOOTTIME)) < 2, "uptime and the boot clock differ"
    assert abs(time.time() - uptime - GUEST_BOOT_EPOCH_S) < 2, f"uptime {uptime} counts from another boot"
    assert abs(time.monotonic() - uptime) < 2, "the monotonic clock counts from another boot"
elif variant == "cpu_number":
    # rdtscp; mov rax, rcx; ret: TSC_AUX, where Linux keeps the CPU number.
    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(bytes.fromhex("0f01f9" "4889c8" "c3"))
    aux = ctypes.CFUNCTYPE(ctypes.c_uint64)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
    assert aux & 0xFFFFFFFF == 0, f"TSC_AUX {aux:#x}: a host CPU number"
else:
    libc = ctypes.CDLL(None, use_errno=True)
    ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 0x1023, 18
    assert libc.syscall(158, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == -1, "AMX tile data granted"
    assert ctypes.get_errno() == errno.EOPNOTSUPP, errno.errorcode.get(ctypes.get_errno())
print("contained")
