# attack: anonymous mmap regions, every page written
# expect: out_of_memory
# limits: {"timeout_ms": 60000}
# must not: take host memory beyond the request's memory limit
import mmap

regions = []
while True:
    region = mmap.mmap(-1, 16 << 20)
    region[::4096] = b"x" * (4 << 10)
    regions.append(region)
