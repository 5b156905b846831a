import fcntl, os, struct, time
import functools
print = functools.partial(print, flush=True)
path = "locked.txt"
with open(path, "w") as f:
    f.write("x" * 100)
f = open(path, "r+")
fcntl.flock(f, fcntl.LOCK_EX)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    g = open(path, "r+")
    try:
        fcntl.flock(g, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("child: flock NB got it (wrong)")
    except BlockingIOError:
        print("child: flock NB would block")
    # The inherited description shares the parent's flock: no conflict.
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("child: inherited description converts freely")
    os.write(w, b"1")
    fcntl.flock(g, fcntl.LOCK_SH)
    print("child: got shared flock after the parent let go")
    # Record locks: the parent holds bytes 10..20.
    try:
        fcntl.lockf(g, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 10)
        print("child: lockf got it (wrong)")
    except OSError as e:
        print("child: lockf", e.errno == 11 or e.errno == 13)
    fl = struct.pack("hhxxxxqqixxxx", fcntl.F_WRLCK, 0, 0, 0, 0)
    res = struct.unpack("hhxxxxqqixxxx", fcntl.fcntl(g, fcntl.F_GETLK, fl))
    print("child: F_GETLK", res[0] == fcntl.F_WRLCK, res[2], res[3], res[4] == os.getppid())
    fcntl.lockf(g, fcntl.LOCK_EX, 0, 5)
    print("child: lockf bytes 0..5 ok")
    fcntl.lockf(g, fcntl.LOCK_EX, 10, 10)
    print("child: lockf 10..20 after parent closed")
    os._exit(0)
os.read(r, 1)
fcntl.lockf(f, fcntl.LOCK_EX, 10, 10)
time.sleep(0.2)
fcntl.flock(f, fcntl.LOCK_UN)
time.sleep(0.3)
h = open(path)
h.close()  # closing any fd of the file lets this process's record locks go
_, status = os.waitpid(pid, 0)
print("parent: child status", status)
