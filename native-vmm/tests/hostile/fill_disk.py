# attack: fill /tmp or /work with one growing file
# expect: ok
# variants: /tmp /work
# must not: write to the host's disk; the writable directories live in the VM's in-memory overlay, which ends in ENOSPC
import errno, os, sys

path = os.path.join(sys.argv[1], "filler")
written = 0
try:
    with open(path, "wb") as f:
        while True:
            f.write(b"\0" * (1 << 20))
            written += 1 << 20
            if written > 1 << 30:
                raise SystemExit(f"wrote {written} bytes without ENOSPC")
except OSError as e:
    if e.errno != errno.ENOSPC:
        raise
size = os.path.getsize(path)
os.remove(path)
# Once the file is gone its space is back.
with open(path, "wb") as f:
    f.write(b"\0" * (1 << 20))
print(f"ENOSPC after {size >> 20} MiB; contained")
