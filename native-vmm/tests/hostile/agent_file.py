# attack: rewrite the in-VM agent (and any image file) so that the next request runs attacker code
# expect: ok
# must not: change a file of the read-only image, in this VM or the next
import errno, os

agent = "/opt/sandfork/agent.py"
with open(agent, "rb") as f:
    original = f.read()
assert b"AWAIT_REQUEST" in original
for attempt in (
    lambda: open(agent, "ab"),
    lambda: open(agent, "r+b"),
    lambda: os.truncate(agent, 0),
    lambda: os.remove(agent),
    lambda: os.rename(agent, "/tmp/agent.py"),
    lambda: os.chmod(agent, 0o777),
    lambda: open("/usr/bin/python3.11", "r+b"),
    lambda: os.mkdir("/opt/sandfork/evil"),
    lambda: os.symlink("/tmp/x", "/opt/sandfork/evil"),
):
    try:
        attempt()
    except OSError as e:
        assert e.errno in (errno.EROFS, errno.EACCES, errno.EPERM), e
    else:
        raise SystemExit("an image file was changed")
print("contained")
