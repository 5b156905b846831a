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
import io
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

# numpy's BLAS (OpenBLAS, where the image has it) reserves tens of MiB of address space when it
# loads, which the smallest VM (64 MiB) has no room for beside the interpreter: there the agent
# leaves numpy to the code.
MIN_NUMPY_MEMORY_BYTES = 128 << 20
if os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >= MIN_NUMPY_MEMORY_BYTES:
    try:
        import numpy
    except ImportError:
        pass

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
# A script's result (the same JSON as a cell's) goes to the VMM with PUBLISH_RESULT(buf, len).
PUBLISH_RESULT = 0x5346_0002
# A cell's value is returned as its repr, cut to this many characters.
MAX_VALUE_CHARS = 64 * 1024
# The VMM reads at most this much of a result (agent.rs, MAX_RESULT_BYTES): rich results that
# would not fit are left out, with a line on stderr saying so.
MAX_RESULT_BYTES = 1 << 20
# What a template definition adds to the image (runtime/template-definition.ts): Python
# packages unpacked from wheels, environment variables, and a setup program run once, before
# the ready point (warm imports, data loading).
TEMPLATE_DIR = "/opt/sandfork"
TEMPLATE_SITE_PACKAGES = os.path.join(TEMPLATE_DIR, "site-packages")
TEMPLATE_ENV = os.path.join(TEMPLATE_DIR, "env.json")
TEMPLATE_SETUP = os.path.join(TEMPLATE_DIR, "setup.py")
# The formats charts are captured in: "png" (default), "svg" or both ("png,svg").
FIGURE_FORMATS_VARIABLE = "SANDFORK_FIGURE_FORMATS"
FIGURE_MIME = {"png": "image/png", "svg": "image/svg+xml"}
# Jupyter's display methods, in the order a result lists their formats.
REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_latex_", "text/latex"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_json_", "application/json"),
)
BINARY_MIME = ("image/png", "image/jpeg")


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


class Display:
    """The rich results of one script or cell, in the order they were shown: charts (each open
    matplotlib figure when plt.show() is called or the code ends), objects passed to display(),
    and the last expression's rich formats (Jupyter's _repr_*_ methods)."""

    def __init__(self):
        self.results = []
        self.bytes = 0

    def add(self, mime, data):
        if isinstance(data, bytes):
            import base64  # only here: the agent's boot must fit the smallest VM

            data = base64.b64encode(data).decode("ascii") if mime in BINARY_MIME else data.decode("utf-8", "replace")
        elif mime == "application/json" and not isinstance(data, str):
            data = json.dumps(data)
        elif not isinstance(data, str):
            data = str(data)
        size = len(mime) + len(data) + 32
        if self.bytes + size > MAX_RESULT_BYTES:
            sys.stderr.write(f"sandfork: a {mime} result of {len(data)} bytes was left out: the results of one run are limited to {MAX_RESULT_BYTES} bytes\n")
            return
        self.bytes += size
        self.results.append({"type": mime, "data": data})

    def add_figure(self, figure):
        requested = os.environ.get(FIGURE_FORMATS_VARIABLE, "png").replace(" ", "").split(",")
        for fmt in [f for f in requested if f in FIGURE_MIME] or ["png"]:
            buffer = io.BytesIO()
            figure.savefig(buffer, format=fmt, bbox_inches="tight")
            self.add(FIGURE_MIME[fmt], buffer.getvalue())

    def capture_figures(self):
        """Every open matplotlib figure, then closed (as plt.show() does for a notebook)."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        for number in pyplot.get_fignums():
            figure = pyplot.figure(number)
            try:
                self.add_figure(figure)
            finally:
                pyplot.close(figure)

    def add_object(self, value):
        """`value`'s rich formats; True when it had any."""
        figure_type = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
        if figure_type is not None and isinstance(value, figure_type):
            self.add_figure(value)
            pyplot = sys.modules.get("matplotlib.pyplot")
            if pyplot is not None:  # a Figure made without pyplot is in no figure list
                pyplot.close(value)
            return True
        shown = False
        for method, mime in REPR_METHODS:
            render = getattr(type(value), method, None)
            if render is None:
                continue
            try:
                data = render(value)
            except Exception:
                continue
            if isinstance(data, tuple):  # (data, metadata)
                data = data[0]
            if data is not None:
                self.add(mime, data)
                shown = True
        return shown


# The current run's Display (a script's or a cell's).
_display = None


def display(*objects):
    """Shows each object as a rich result (Jupyter's display()): its HTML, image or JSON forms,
    else its repr as text."""
    for value in objects:
        if _display is None:
            continue
        if not _display.add_object(value):
            _display.add("text/plain", repr(value)[:MAX_VALUE_CHARS])


def show(*args, **kwargs):
    """plt.show(): each open figure becomes a result."""
    if _display is not None:
        _display.capture_figures()


def hook_pyplot():
    """Routes plt.show() to the current Display, when pyplot is loaded."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None and pyplot.show is not show:
        pyplot.show = show


def start_display():
    global _display
    _display = Display()
    hook_pyplot()


def finish_display(value):
    """Ends the current run's display: open figures are captured, then the rich forms of
    `value` (the last expression's, None when there was none). Returns (value text or None,
    results)."""
    global _display
    current, _display = _display, None
    text = None
    try:
        current.capture_figures()
        if value is not None:
            current.add_object(value)
            text = repr(value)[:MAX_VALUE_CHARS]
    except Exception as error:
        sys.stderr.write(f"sandfork: capturing the results failed: {error!r}\n")
    return text, current.results


def run_code(source, filename, namespace):
    """Runs `source` in `namespace` as a notebook runs a cell: its statements in order, then its
    last statement, when that is an expression, on its own; returns that expression's value
    (None when there is none). A SyntaxError comes without a traceback: as for a script, it is
    the code's, not the frames compiling it."""
    try:
        tree = ast.parse(source, filename, "exec")
    except SyntaxError as error:
        raise error.with_traceback(None) from None
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = compile(ast.Expression(tree.body.pop().value), filename, "eval", dont_inherit=True)
    exec(compile(tree, filename, "exec", dont_inherit=True), namespace)
    return None if last is None else eval(last, namespace)


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
    code installed its own), leaving out the agent's frames at the traceback's head."""
    # The interpreter prints the exception's own __traceback__, not the hook's argument.
    while error.__traceback__ is not None and error.__traceback__.tb_frame.f_code.co_filename == __file__:
        error.__traceback__ = error.__traceback__.tb_next
    try:
        sys.excepthook(type(error), error, error.__traceback__)
    except Exception:
        traceback.print_exception(error)


def run_script(source, path, main=None):
    """Runs `source` as the script at `path` would run as __main__ (in `main`, a module whose
    names it sees, or a fresh one); returns the exit code and the value of a final expression
    statement (None when there is none)."""
    if main is None:
        main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    try:
        return 0, run_code(source, path, main.__dict__)
    except SystemExit as system_exit:
        return exit_code_of(system_exit), None
    except BaseException as error:
        report_uncaught(error)
        return 1, None


def publish_result(value, results):
    """Hands a script's result to the VMM (PUBLISH_RESULT), when it has one."""
    if value is None and not results:
        return
    payload = json.dumps({"value": value, "results": results}).encode()
    if _syscall(PUBLISH_RESULT, payload, len(payload)) < 0:
        sys.stderr.write(f"sandfork: the result was not passed on (errno {ctypes.get_errno()})\n")


def run_cell(source, namespace, number):
    """Runs one session cell in `namespace` as a notebook does: statements in order, and the
    value of a final expression returned (and kept as `_`). Returns the result dict."""
    filename = f"<cell {number}>"
    # Tracebacks show the cell's lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    start_display()
    value = None
    error_result = None
    try:
        value = run_code(source, filename, namespace)
        if value is not None:
            namespace["_"] = value
    except BaseException as error:
        # SystemExit too: in a session it ends the cell, not the kernel (as in a notebook).
        report_uncaught(error)
        error_result = {"name": type(error).__name__, "message": str(error)[:MAX_VALUE_CHARS]}
    text, results = finish_display(value)
    return {"value": text, "error": error_result, "results": results}


def reseed(request):
    """Every fork of a template (or of a session checkpoint) starts from the same memory, so
    the generators seeded before the ready point hold the same state in all of them: reseed
    them from the fresh host entropy each request carries (getrandom here would cost a VM
    exit per call)."""
    seed = bytes.fromhex(request["seed"])
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(numpy.frombuffer(seed, dtype=numpy.uint32))


def serve_session(request):
    """A session's life: cells run in one `__main__` until the VM is destroyed. A session saved
    as a template is stopped here between cells, so its forks get their requests here too: a
    session's next cell, or an execution, which runs as a script in the session's `__main__`
    (its variables and imports there) and ends the process as a script does."""
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.path.insert(0, WORK_DIR)
    number = 0
    while True:
        if not request.get("session"):
            run_request(request, main)
        os.environ.update(request["env"])
        if request["session"]["reseed"]:
            reseed(request)
        number += 1
        result = run_cell(request["code"], main.__dict__, number)
        flush_streams()
        request = await_request(json.dumps(result).encode())


def flush_streams():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def finish(code):
    """Runs atexit handlers, flushes the streams and ends the process with `code`."""
    atexit._run_exitfuncs()
    flush_streams()
    os._exit(code)


def run_request(request, main=None):
    """Runs an execution's script and ends the process: as __main__ (a fresh module, or `main`:
    a saved session's), its result published."""
    reseed(request)
    argv = request["argv"]
    sys.argv = list(argv)
    os.environ.update(request["env"])
    path = os.path.join(WORK_DIR, argv[0])
    # As for `python script.py`: the script's folder comes first on the import path.
    sys.path.insert(0, os.path.dirname(path))
    start_display()
    code, value = run_script(request["code"], path, main)
    publish_result(*finish_display(value))
    finish(code)


def main():
    request = await_request()
    if request.get("session"):
        serve_session(request)
    run_request(request)


def prepare_template():
    """Applies what a template definition put in the image: its wheels' packages come first on
    the import path, its environment is set, and its setup program runs (its output is kept
    back: the ready point must see none; a failure ends the agent with the output and the
    traceback on stderr, which the template build reports)."""
    if os.path.isdir(TEMPLATE_SITE_PACKAGES):
        sys.path.insert(0, TEMPLATE_SITE_PACKAGES)
    if os.path.exists(TEMPLATE_ENV):
        with open(TEMPLATE_ENV, encoding="utf-8") as env:
            os.environ.update(json.load(env))
    if not os.path.exists(TEMPLATE_SETUP):
        return
    with open(TEMPLATE_SETUP, encoding="utf-8") as setup:
        source = setup.read()
    import contextlib  # only here: the agent's boot must fit the smallest VM

    namespace = {"__name__": "__sandfork_setup__", "__file__": TEMPLATE_SETUP, "__builtins__": builtins}
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            exec(compile(source, TEMPLATE_SETUP, "exec", dont_inherit=True), namespace)
    except BaseException as error:
        sys.stderr.write(captured.getvalue()[-2000:])
        sys.stderr.write("sandfork: the template's setup program failed:\n")
        report_uncaught(error)
        sys.stderr.flush()
        os._exit(70)


builtins.display = display
prepare_template()
hook_pyplot()

# The objects created so far are the template's: collected once and frozen so that the
# collector never walks (and writes to) them in a fork, where each first write copies a page.
gc.collect()
gc.freeze()

try:
    main()
except BaseException as failure:
    sys.stderr.write(f"sandfork agent: {failure!r}\n")
    finish(70)  # EX_SOFTWARE: the agent itself failed, not the user's code
