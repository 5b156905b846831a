# attack: raw in and out to I/O ports: the PIC, PIT, keyboard, CMOS, POST, PCI config, serial, the VMM's exception port and its neighbours, the last port; in from the syscall port
# expect: crashed
# variants: in:0x0 out:0x0 in:0x20 out:0x20 in:0x40 out:0x43 in:0x60 out:0x64 in:0x70 out:0x71 out:0x80 in:0xcf8 out:0xcfc in:0x3f8 out:0x3f8 in:0xe0 in:0xe1 out:0xe1 in:0xdf out:0xdf out:0xe2 in:0xffff out:0xffff inw:0xe0 outw:0xe0 outl:0xe0 ins:0xe0 outs:0xe1
# must not: reach a device or the VMM other than through the syscall stub; every one is a general protection fault
import ctypes, mmap, sys

kind, port = sys.argv[1].split(":")
OPCODE = {"in": "ec", "out": "ee", "inw": "66ed", "outw": "66ef", "outl": "ef", "ins": "6c", "outs": "6e"}
scratch = ctypes.create_string_buffer(64)
# mov dx, port; mov rdi/rsi, scratch (for ins/outs); the instruction; ret
code = bytes.fromhex("66ba") + int(port, 16).to_bytes(2, "little")
code += bytes.fromhex("48bf") + ctypes.addressof(scratch).to_bytes(8, "little")
code += bytes.fromhex("48be") + ctypes.addressof(scratch).to_bytes(8, "little")
code += bytes.fromhex(OPCODE[kind]) + b"\xc3"
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
raise SystemExit(f"{sys.argv[1]} went through")
