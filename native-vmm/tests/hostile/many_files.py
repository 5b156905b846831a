# attack: a million tiny files in /tmp
# expect: timeout
# limits: {"timeout_ms": 500}
# must not: create files on the host; ENOSPC before its time is up is as good (the overlay's byte limit charges every name)
import errno, os

n = 0
try:
    while n < 1_000_000:
        os.close(os.open(f"/tmp/{n}", os.O_CREAT | os.O_WRONLY, 0o600))
        n += 1
except OSError as e:
    if e.errno != errno.ENOSPC:
        raise
    # Reported as a timeout by the test's expectation only if it ran out of time first.
    while True:
        pass
raise SystemExit("a million files were created within the time limit")
