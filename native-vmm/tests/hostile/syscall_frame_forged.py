# attack: forge the syscall stub's iretq frame (user-writable where the stub runs at CPL3) with a non-canonical or kernel rip, a non-canonical rsp, or IOPL 3 and NT in rflags, then enter the VMM with `out` while another thread is runnable, so the VMM saves the forged frame as the thread's state and loads it back later; or jump straight to the stub's own `out` with the forged frame in place (stub_out)
# expect: ok
# expect-variants: stub_out=crashed
# expect-off-pvm: rip=crashed kernel=crashed rsp=crashed iopl=crashed stub_out=crashed
# (off PVM the program's own `out` is a #GP and the stub page is supervisor-only: crashed before anything is forged)
# variants: rip kernel rsp iopl stub_out
# must not: have the VMM load a rip outside user space, a non-canonical rsp or privileged rflags into the vCPU, or fail with an error of its own
import ctypes, mmap, sys, threading

FRAME_RIP, FRAME_RFLAGS, FRAME_RSP = 0x8FD8, 0x8FE8, 0x8FF0
STUB_OUT = 0x7035  # the syscall stub's `out`, after it wrote the frame
SCHED_YIELD = 24
variant = sys.argv[1]


def imm64(reg_prefix, value):
    return bytes.fromhex(reg_prefix) + value.to_bytes(8, "little")


# rip: where the thread resumes. Honest (the pushfq after the out) for the rsp and iopl
# variants, forged for rip and kernel.
forged_rip = {"rip": 0x8000_0000_0000_0000, "kernel": 0xFFFF_8880_0000_0000,
              "stub_out": 0xFFFF_8880_0000_0000}.get(variant)
rflags = 0x3202 | 0x4000 if variant == "iopl" else 0x202
code = b""
code += imm64("48b8", rflags)                                    # mov rax, rflags
code += bytes.fromhex("48890425") + FRAME_RFLAGS.to_bytes(4, "little")  # mov [FRAME_RFLAGS], rax
if variant == "rsp":
    code += imm64("48b8", 0x8000_0000_0000_1000)                 # mov rax, non-canonical
    code += bytes.fromhex("48890425") + FRAME_RSP.to_bytes(4, "little")
else:
    code += bytes.fromhex("48892425") + FRAME_RSP.to_bytes(4, "little")  # mov [FRAME_RSP], rsp
if forged_rip is not None:
    code += imm64("48b8", forged_rip)
else:
    code += bytes.fromhex("488d0500000000")                      # lea rax, [rip+N] (patched)
    lea_at = len(code)
code += bytes.fromhex("48890425") + FRAME_RIP.to_bytes(4, "little")     # mov [FRAME_RIP], rax
code += bytes.fromhex("b8") + SCHED_YIELD.to_bytes(4, "little")  # mov eax, SCHED_YIELD
if variant == "stub_out":
    code += imm64("49b8", STUB_OUT) + bytes.fromhex("41ffe0")     # mov r8, STUB_OUT; jmp r8
else:
    code += bytes.fromhex("e6e0")                                # out 0xE0, al
resume = len(code)
code += bytes.fromhex("9c58c3")                                  # pushfq; pop rax; ret
if forged_rip is None:
    # lea's displacement: from the end of the lea to the pushfq.
    code = code[: lea_at - 4] + (resume - lea_at).to_bytes(4, "little") + code[lea_at:]

page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
run = ctypes.CFUNCTYPE(ctypes.c_uint64)(ctypes.addressof(ctypes.c_char.from_buffer(page)))

stop = False


def spin():
    while not stop:
        pass


spinner = threading.Thread(target=spin)
spinner.start()
try:
    flags = run()
finally:
    stop = True
    spinner.join()
# The program's own `out` leaves its state in the registers: the VMM ignores the frame, and the
# thread resumes after its `out`, on its own stack, with its own flags.
assert (flags >> 12) & 3 == 0, f"IOPL {(flags >> 12) & 3} reached the program"
assert not flags & 0x4000, "NT reached the program"
assert flags & 0x200, "IF is clear"
print("contained")
