# attack: CPL0-only instructions from the program's own code (CPL3): hlt, cli, sti, wrmsr, rdmsr, lgdt, lidt, ltr, mov to and from cr3, invlpg, wbinvd, swapgs, sysret
# expect: crashed
# variants: hlt cli sti wrmsr rdmsr lgdt lidt ltr mov_to_cr3 mov_from_cr3 invlpg wbinvd swapgs sysretq
# must not: run at CPL0 or change the VM's descriptors, page tables or MSRs; each is a general protection fault
import ctypes, mmap, sys

CODE = {
    "hlt": "f4", "cli": "fa", "sti": "fb", "wrmsr": "0f30", "rdmsr": "0f32",
    "lgdt": "0f0110", "lidt": "0f0118", "ltr": "0f00d8", "mov_to_cr3": "0f22d8", "mov_from_cr3": "0f20d8",
    "invlpg": "0f0138", "wbinvd": "0f09", "swapgs": "0f01f8", "sysretq": "480f07",
}
# rax points at a readable page for the instructions that take a memory operand.
scratch = ctypes.create_string_buffer(64)
code = bytes.fromhex("48b8") + ctypes.addressof(scratch).to_bytes(8, "little") + bytes.fromhex(CODE[sys.argv[1]]) + b"\xc3"
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
raise SystemExit(f"{sys.argv[1]} ran at CPL3")
