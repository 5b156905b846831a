# attack: code that rewrites itself while it runs (a JIT's pattern), and code written through one mapping and run through another
# expect: ok
# must not: run stale instructions or crash the VMM; the program sees its own writes
import ctypes, mmap

page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
base = ctypes.addressof(ctypes.c_char.from_buffer(page))
function = ctypes.CFUNCTYPE(ctypes.c_long)(base)
for value in range(1, 200):
    # mov eax, value; ret
    page[0:6] = bytes.fromhex("b8") + value.to_bytes(4, "little") + b"\xc3"
    assert function() == value
# The code patches its own immediate before reaching it: mov byte [rip+1], 7; mov eax, 1; ret
page[0:13] = bytes.fromhex("c605010000000" + "7") + bytes.fromhex("b801000000c3")
assert function() == 7, function()
print("contained")
