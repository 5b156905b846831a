# attack: every system call number 0..1023 (and a few past Linux's range), each with several sets of garbage arguments: addresses in the system area, non-canonical and kernel addresses, all ones, huge lengths, negative descriptors
# expect: ok
# variants: 0 256 512 768
# must not: crash or hang the VMM, or answer with anything but an errno or a harmless value; the calls that end a process (exit, exit_group) wait for a signal (pause, rt_sigsuspend: with nothing to send one, the run ends as deadlocked) or return from a handler that never ran (rt_sigreturn: unsupported) are left out, and so is vfork, whose child runs on the caller's memory: it would go on with the sweep in the caller's stead, which is undefined on Linux too
import ctypes, sys

libc = ctypes.CDLL(None, use_errno=True)
syscall = libc.syscall
syscall.restype = ctypes.c_long
syscall.argtypes = (ctypes.c_long,) * 7
SKIP = {15, 34, 58, 60, 130, 231}
GARBAGE = [
    (0x1000, 0x5000, 0x7000, 0x9000, 0xFFFFF, 0x10),
    (-1, -1, -1, -1, -1, -1),
    (0xFFFF_8000_0000_0000 - (1 << 64), 1 << 40, -100, 0x8000_0000_0000_0000 - (1 << 64), 1 << 62, -9),
    (-100, 0x7000, 1 << 31, 0xDEAD_BEEF, -4096, 0x0000_7FFF_FFFF_F000),
]
start = int(sys.argv[1])
answers = {}
for nr in list(range(start, start + 256)) + ([0x5346_0002, 1 << 31, -1] if start == 768 else []):
    if nr in SKIP:
        continue
    for args in GARBAGE:
        result = syscall(nr, *args)
        if result >= 0 and nr in range(0, 1024):
            answers.setdefault("ok", []).append(nr)
        else:
            answers.setdefault(ctypes.get_errno(), []).append(nr)
print({k: len(v) for k, v in answers.items()})
print("contained")
