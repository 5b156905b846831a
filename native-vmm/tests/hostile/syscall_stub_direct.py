# attack: enter the VMM without the syscall instruction: jump to the syscall stub's code (user-readable on PVM), or `out` to the syscall port from the program's own code
# expect: ok
# expect-off-pvm: stub=crashed port=ok|crashed
# (off PVM: AMD SVM in QEMU's software CPU answers the program's own `out` with a #GP, crashed;
#  either way the program reaches the VMM as nothing but its own system call)
# variants: stub port
# must not: reach the VMM in any way other than as one ordinary system call of this program
import ctypes, mmap, os, sys

STUB = 0x7000
GETPID = 39
if sys.argv[1] == "stub":
    # mov eax, GETPID; mov r11, 0x202 (rflags, as syscall saves them: the stub's iretq restores
    # r11, and whatever ctypes left there may set AC); lea rcx, [rip+13] (the ret: rcx is the
    # return address, as syscall sets it); mov r8, STUB; jmp r8; ret. Off PVM the stub page is
    # supervisor-only: a page fault.
    code = bytes.fromhex("b8") + GETPID.to_bytes(4, "little") + bytes.fromhex("49c7c302020000") + bytes.fromhex("488d0d0d000000")
    code += bytes.fromhex("49b8") + STUB.to_bytes(8, "little") + bytes.fromhex("41ffe0") + b"\xc3"
else:
    # mov eax, GETPID; out 0xE0, al; ret: the VMM sees this program's system call, nothing more.
    code = bytes.fromhex("b8") + GETPID.to_bytes(4, "little") + bytes.fromhex("e6e0") + b"\xc3"
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
answer = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
assert answer == os.getpid(), answer
print("contained")
