import functools, os, sqlite3
print = functools.partial(print, flush=True)
db = sqlite3.connect("two.db", isolation_level=None)
db.execute("create table t (x)")
db.execute("begin exclusive")
db.execute("insert into t values (1)")
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    other = sqlite3.connect("two.db", timeout=0, isolation_level=None)
    try:
        other.execute("insert into t values (2)")
        print("child: wrote inside the parent's transaction (wrong)")
    except sqlite3.OperationalError as e:
        print("child:", e)
    os.write(w, b"1")
    other.close()
    os._exit(0)
os.read(r, 1)
db.execute("commit")
os.waitpid(pid, 0)
other = sqlite3.connect("two.db", timeout=5, isolation_level=None)
other.execute("insert into t values (3)")
print("rows:", [x for (x,) in db.execute("select x from t order by x")])
