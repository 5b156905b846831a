# attack: look for another VM's files (the canary requests that run meanwhile write a secret to their /tmp)
# expect: ok
# must not: find the other VM's secret anywhere in this VM's file system
import os
import stat

SECRET = b"CANARY-" + b"SECRET"  # spelt in two parts so that this file does not hold it
found = []
for top in ("/tmp", "/work", "/dev", "/opt", "/etc"):
    for root, dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            try:
                # Files only: a device such as /dev/ptmx can block a read, as on Linux.
                if not stat.S_ISREG(os.stat(path).st_mode):
                    continue
                with open(path, "rb") as f:
                    if SECRET in f.read(1 << 20):
                        found.append(path)
            except OSError:
                pass
if found:
    raise SystemExit(f"another VM's secret is visible at {found}")
print("contained")
