# attack: read, write or jump into the system area below 1 MiB: page tables, GDT, TSS, IDT, the CPL0 stubs' stacks, the NULL page; write the vDSO's data page (the clock every VM reads) or its code
# expect: crashed
# variants: read:0x0 read:0x1000 write:0x1000 read:0x5000 write:0x5080 read:0x6000 write:0x6000 write:0x7000 write:0xa000 read:0x10000 jump:0x1000 jump:0x6000 jump:0x7010 jump:0x7ffff jump:0xfffff write:0xfd000 write:0xfd008 write:0xfe000 write:0xff000 jump:0x0 jump:0x8000000000000000 read:0xffff800000000000
# must not: read or change the VM's page tables, descriptors or stub code, or run code there, or change the vDSO or its clock (user read-only); each is a page fault (or a general protection fault for a non-canonical address)
import ctypes, mmap, sys

op, address = sys.argv[1].split(":")
target = int(address, 16)
# mov rax, target; then: mov rax, [rax] | mov byte [rax], 1 | jmp rax
BODY = {"read": "488b00", "write": "c60001", "jump": "ffe0"}
code = bytes.fromhex("48b8") + target.to_bytes(8, "little") + bytes.fromhex(BODY[op]) + b"\xc3"
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
raise SystemExit(f"{sys.argv[1]} went through")
