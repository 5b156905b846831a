# attack: signals to itself and to pid 1 (which is itself), to pid -1 (everyone), to other pids; a handler, run on a signal frame in its own stack
# expect: error
# variants: kill_self kill_pid1 kill_all kill_other sigterm_ignored abort handler
# expect-variants: kill_self=error kill_pid1=error kill_all=error kill_other=ok sigterm_ignored=ok abort=error handler=ok
# must not: signal anything outside the VM; a terminating signal ends the run as Linux's default action would (exit code 128+n)
import errno, os, signal, sys

case = sys.argv[1]
if case == "kill_self":
    os.kill(os.getpid(), signal.SIGKILL)
elif case == "kill_pid1":
    os.kill(1, signal.SIGTERM)
elif case == "kill_all":
    os.kill(-1, signal.SIGKILL)
elif case == "kill_other":
    for pid in (2, 100, 4_000_000, -2, -100):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError as e:
            assert e.errno in (errno.ESRCH, errno.EPERM), (pid, e)
        else:
            raise SystemExit(f"kill({pid}) succeeded")
    raise SystemExit(print("contained"))
elif case == "sigterm_ignored":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.kill(os.getpid(), signal.SIGTERM)
    raise SystemExit(print("contained"))
elif case == "abort":
    os.abort()
elif case == "handler":
    ran = []
    signal.signal(signal.SIGUSR1, lambda *_: ran.append(True))
    os.kill(os.getpid(), signal.SIGUSR1)
    raise SystemExit(print("contained") if ran else "the handler did not run")
raise SystemExit(f"{case}: still running")
