"""Sandfork's in-VM agent for the Python template.

The VMM boots this file as the guest program (`python3 -I -B /opt/sandfork/agent.py`; the
flags are explained at PYTHON_AGENT in native-vmm/src/agent.rs, as is the hash secret every
fork of a template shares).
It imports what user code commonly needs, then makes Sandfork's private system call
AWAIT_REQUEST: that call is the template's READY POINT. A template build stops the VM inside
it and snapshots it there; a fork (or a fresh boot, until forks exist) is answered with the
request. Everything before that call is paid once per template, everything after it once per
request, so this file does as much as it can before and as little as it can after.

After the hand-off the agent runs the request's code as CPython runs a script: a fresh
`__main__` module with `__file__` = /work/<argv[0]> (the VMM has placed the code there, so
tracebacks show its lines), SystemExit and uncaught exceptions handled as the interpreter does,
atexit handlers run, streams flushed, and the process ends with os._exit.

A request marked `session` (a stateful session's first cell, native-vmm/src/agent.rs) turns the
agent into a notebook-like kernel instead: each request's code runs as a cell in one lasting
`__main__` namespace (variables, imports and open files stay), the value of a cell's last
expression is returned (as its repr, not printed), and the agent then makes AWAIT_REQUEST
again, passing the cell's result, and waits there for the next cell: the VMM can snapshot the
VM at that point exactly as it snapshots a template at its ready point.
"""

import sys
import os
import ast
import atexit
import builtins
import ctypes
import gc
import importlib.machinery
import types

_libc = ctypes.CDLL(None, use_errno=True)

# Every brk is a VM exit: grow the heap in 8 MiB steps (the VMM only records the new break, so
# untouched padding costs nothing) and never give it back. Set before the imports below, so the
# heap the template ends with already has room for a request's first allocations.
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
_libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
_libc.mallopt(M_TOP_PAD, 8 << 20)

# Warm-up: the modules user code commonly imports are loaded before the ready point, where they
# cost nothing per request.
import collections
import datetime
import decimal
import functools
import itertools
import json
import linecache
import math
import random
import re
import statistics
import traceback

try:
    import numpy
except ImportError:
    numpy = None

# Sandfork's private system call (numbered outside Linux's range; the one definition on the
# VMM side is native-vmm/src/agent.rs, AWAIT_REQUEST_SYSCALL).
AWAIT_REQUEST = 0x5346_0001
# The request does not fit the buffer: the VMM wrote the size it needs as a little-endian u64
# at the buffer's start.
E2BIG = 7
FIRST_BUFFER_BYTES = 64 * 1024
WORK_DIR = "/work"

_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = (ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t)
# A session's AWAIT_REQUEST also passes the last cell's result (JSON) and CELL_RESULT_MAGIC,
# which tells the VMM that the two arguments before it are that result (agent.rs).
_session_syscall = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long, use_errno=True)(("syscall", _libc))
CELL_RESULT_MAGIC = 0x5346_4345
# A cell's value is returned as its repr, cut to this many characters.
MAX_VALUE_CHARS = 64 * 1024


def await_request(result=None):
    """Blocks in AWAIT_REQUEST (the ready point) and returns the request as a dict; `result`
    (a session cell's outcome, bytes) travels with the call."""
    size = FIRST_BUFFER_BYTES
    while True:
        buffer = ctypes.create_string_buffer(size)
        if result is None:
            length = _syscall(AWAIT_REQUEST, buffer, size)
        else:
            length = _session_syscall(AWAIT_REQUEST, buffer, size, result, len(result), CELL_RESULT_MAGIC)
        if length >= 0:
            return json.loads(buffer.raw[:length])
        errno = ctypes.get_errno()
        needed = int.from_bytes(buffer.raw[:8], "little")
        if errno != E2BIG or needed <= size:
            raise OSError(errno, "AWAIT_REQUEST failed")
        size = needed


def exit_code_of(system_exit):
    """The process exit code for a SystemExit, as CPython's handle_system_exit computes it."""
    code = system_exit.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:
        pass
    return 1


def report_uncaught(error):
    """Prints an uncaught exception through sys.excepthook (the standard traceback unless the
    code installed its own), leaving out the agent's frame at the traceback's head."""
    if error.__traceback__ is not None:
        # The interpreter prints the exception's own __traceback__, not the hook's argument.
        error.__traceback__ = error.__traceback__.tb_next
    try:
        sys.excepthook(type(error), error, error.__traceback__)
    except Exception:
        traceback.print_exception(error)


def run_script(source, path):
    """Runs `source` as the script at `path` would run as __main__; returns the exit code."""
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    try:
        code = compile(source, path, "exec", dont_inherit=True)
        exec(code, main.__dict__)
        return 0
    except SystemExit as system_exit:
        return exit_code_of(system_exit)
    except BaseException as error:
        report_uncaught(error)
        return 1


def run_cell(source, namespace, number):
    """Runs one session cell in `namespace` as a notebook does: statements in order, and the
    value of a final expression returned (and kept as `_`). Returns the result dict."""
    filename = f"<cell {number}>"
    # Tracebacks show the cell's lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        tree = ast.parse(source, filename, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, filename, "exec", dont_inherit=True), namespace)
        value = None if last is None else eval(compile(last, filename, "eval", dont_inherit=True), namespace)
        if value is None:
            return {"value": None, "error": None}
        namespace["_"] = value
        return {"value": repr(value)[:MAX_VALUE_CHARS], "error": None}
    except BaseException as error:
        # SystemExit too: in a session it ends the cell, not the kernel (as in a notebook).
        report_uncaught(error)
        return {"value": None, "error": {"name": type(error).__name__, "message": str(error)[:MAX_VALUE_CHARS]}}


def reseed(request):
    """Every fork of a template (or of a session checkpoint) starts from the same memory, so
    the generators seeded before the ready point hold the same state in all of them: reseed
    them from the fresh host entropy each request carries (getrandom here would cost a VM
    exit per call)."""
    seed = bytes.fromhex(request["seed"])
    random.seed(seed)
    if numpy is not None:
        numpy.random.seed(numpy.frombuffer(seed, dtype=numpy.uint32))


def serve_session(request):
    """A session's life: cells run in one `__main__` until the VM is destroyed."""
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.path.insert(0, WORK_DIR)
    number = 0
    while True:
        os.environ.update(request["env"])
        if request["session"]["reseed"]:
            reseed(request)
        number += 1
        result = run_cell(request["code"], main.__dict__, number)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        request = await_request(json.dumps(result).encode())


def finish(code):
    """Runs atexit handlers, flushes the streams and ends the process with `code`."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def main():
    request = await_request()
    if request.get("session"):
        serve_session(request)
    reseed(request)
    argv = request["argv"]
    sys.argv = list(argv)
    os.environ.update(request["env"])
    path = os.path.join(WORK_DIR, argv[0])
    # As for `python script.py`: the script's folder comes first on the import path.
    sys.path.insert(0, os.path.dirname(path))
    finish(run_script(request["code"], path))


# The objects created so far are the template's: collected once and frozen so that the
# collector never walks (and writes to) them in a fork, where each first write copies a page.
gc.collect()
gc.freeze()

try:
    main()
except BaseException as failure:
    sys.stderr.write(f"sandfork agent: {failure!r}\n")
    finish(70)  # EX_SOFTWARE: the agent itself failed, not the user's code
