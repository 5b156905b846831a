# attack: grow the heap with brk (sbrk) and touch every page until it is refused
# expect: ok
# must not: take host memory beyond the request's memory limit; brk answers ENOMEM at the limit, as under an RLIMIT_DATA
import ctypes

libc = ctypes.CDLL(None)
libc.sbrk.restype = ctypes.c_void_p
libc.sbrk.argtypes = (ctypes.c_long,)
step = 1 << 20
granted = 0
while True:
    p = libc.sbrk(step)
    if p is None or p == ctypes.c_void_p(-1).value:
        break
    ctypes.memset(p, 0x5A, step)
    granted += step
assert 64 << 20 < granted <= 256 << 20, granted
print(f"brk granted {granted >> 20} MiB; contained")
