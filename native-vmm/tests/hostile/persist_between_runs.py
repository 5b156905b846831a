# attack: leave state behind for the next execution: files, environment, working directory, descriptors, signal handlers, module state
# expect: ok
# must not: any of it is seen by the next execution on this daemon (the probe after every program checks)
import json, os, signal, sys

for d in ("/tmp", "/work"):
    with open(os.path.join(d, "left-behind"), "w") as f:
        f.write("HOSTILE-MARK")
    os.makedirs(os.path.join(d, "nest/deeper"), exist_ok=True)
os.environ["HOSTILE"] = "HOSTILE-MARK"
os.putenv("HOSTILE_PUT", "HOSTILE-MARK")
keep = [os.open("/tmp/left-behind", os.O_RDONLY) for _ in range(8)]
os.chdir("/tmp/nest")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
json.dumps = lambda *a, **k: "HOSTILE-MARK"
__builtins__.print = lambda *a, **k: sys.stdout.write("HOSTILE-MARK\n")
sys.stdout.write("contained\n")
