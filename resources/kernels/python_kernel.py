"""sandkasten Python kernel: one long-running interpreter per code context.

Protocol (one JSON object per line):
  stdin (private copy of fd 0):     {"id": ..., "code": "...", "env": {"NAME": "value", ...}}
  stdout (private copy of fd 1):    {"type": "ready", "language": "python"}
                                    {"type": "stream", "id": ..., "name": "stdout"|"stderr", "text": "..."}
                                    {"type": "reply", "id": ..., "execution_count": N, "results": [...], "error": ...}
The process's own fds 0/1/2 are replaced: 0 reads /dev/null, 1 and 2 are pipes read by threads that forward what
any code (print, C extensions, subprocesses) writes as "stream" messages. SIGINT raises KeyboardInterrupt only
while a cell runs; between cells it is ignored.

Arguments after the program (`python3 -c <this> [module ...]`) name modules to import before "ready" (a pool
member's spare kernel, adopted by the sandbox's first context of the language); one that cannot be imported is
skipped, and `sys.argv` is `['-c']` afterwards, as in a kernel started without them.
"""

import ast
import base64
import codecs
import io
import json
import linecache
import os
import signal
import sys
import threading
import traceback

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("MPLCONFIGDIR", "/tmp/.sandkasten/matplotlib")
# Debian's matplotlib reads /etc/matplotlibrc, which a sandbox's synthesised /etc does not have.
if "MATPLOTLIBRC" not in os.environ and not os.path.exists("/etc/matplotlibrc"):
    for _rc in ("/usr/share/matplotlib/mpl-data/matplotlibrc",):
        if os.path.exists(_rc):
            os.environ["MATPLOTLIBRC"] = _rc
# Nor /etc/fonts: an empty fontconfig configuration keeps fc-list quiet (matplotlib finds its own fonts).
if "FONTCONFIG_FILE" not in os.environ and not os.path.exists("/etc/fonts/fonts.conf"):
    try:
        os.makedirs("/tmp/.sandkasten", exist_ok=True)
        with open("/tmp/.sandkasten/fonts.conf", "w") as _conf:
            _conf.write('<?xml version="1.0"?>\n<fontconfig></fontconfig>\n')
        os.environ["FONTCONFIG_FILE"] = "/tmp/.sandkasten/fonts.conf"
    except OSError:
        pass

_requests = os.fdopen(os.dup(0), "rb", buffering=0)
_channel_fd = os.dup(1)
_channel_lock = threading.Lock()
_state = {"in_cell": False, "id": None, "count": 0, "displayed": [], "shown": []}


def _send(message):
    data = (json.dumps(message, ensure_ascii=False) + "\n").encode("utf-8", "replace")
    with _channel_lock:
        view = memoryview(data)
        while view:
            written = os.write(_channel_fd, view)
            view = view[written:]


class _Forwarder(threading.Thread):
    """Reads one redirected fd and forwards its text; a sync token marks "everything before this is sent"."""

    def __init__(self, name, fd):
        super().__init__(daemon=True)
        self.stream_name = name
        self.fd = fd
        self.token = ("\x00sandkasten-sync-%s\x00" % os.urandom(8).hex()).encode()
        self.synced = threading.Semaphore(0)

    def run(self):
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = b""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except InterruptedError:
                continue
            if not chunk:
                return
            pending += chunk
            while True:
                at = pending.find(self.token)
                if at < 0:
                    break
                self._emit(decoder.decode(pending[:at]))
                pending = pending[at + len(self.token):]
                self.synced.release()
            keep = 0
            for size in range(min(len(self.token) - 1, len(pending)), 0, -1):
                if self.token.startswith(pending[-size:]):
                    keep = size
                    break
            self._emit(decoder.decode(pending[: len(pending) - keep]))
            pending = pending[len(pending) - keep:]

    def _emit(self, text):
        if text:
            _send({"type": "stream", "id": _state["id"], "name": self.stream_name, "text": text})

    def sync(self, target_fd):
        """Waits until everything written to `target_fd` so far has been forwarded."""
        try:
            os.write(target_fd, self.token)
        except OSError:
            return
        self.synced.acquire(timeout=5)


def _redirect(target_fd, name):
    read_end, write_end = os.pipe()
    os.dup2(write_end, target_fd)
    os.close(write_end)
    forwarder = _Forwarder(name, read_end)
    forwarder.start()
    return forwarder


_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
_forwarders = {1: _redirect(1, "stdout"), 2: _redirect(2, "stderr")}
sys.stdin = open(os.devnull, "r")
sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8", errors="replace",
                              line_buffering=True, write_through=True)
sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), encoding="utf-8", errors="replace",
                              line_buffering=True, write_through=True)
sys.__stdout__, sys.__stderr__, sys.__stdin__ = sys.stdout, sys.stderr, sys.stdin


def _on_sigint(signum, frame):
    if _state["in_cell"]:
        raise KeyboardInterrupt
    # Between cells an interrupt has nothing to stop.


signal.signal(signal.SIGINT, _on_sigint)

_globals = {"__name__": "__main__", "__builtins__": __builtins__}
_KERNEL_FILE = sys._getframe().f_code.co_filename


def _flush_streams():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    for fd, forwarder in _forwarders.items():
        forwarder.sync(fd)


_RENDERERS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
)
_BINARY = ("image/png", "image/jpeg")


def _bundle(value, main):
    """Jupyter-like mime bundle of one value."""
    bundle = {"is_main_result": main}
    for method, mime in _RENDERERS:
        render = getattr(value, method, None)
        if render is None or isinstance(value, type):
            continue
        try:
            data = render()
            if isinstance(data, tuple):  # (data, metadata), as IPython allows
                data = data[0]
            if mime == "application/json":
                json.dumps(data)
        except Exception:
            continue
        if data is None:
            continue
        if mime in _BINARY:
            if isinstance(data, str):
                data = data.encode("latin-1", "replace")
            data = base64.b64encode(data).decode("ascii")
        bundle[mime] = data
    if _is_figure(value) and "image/png" not in bundle:
        bundle["image/png"] = _figure_png(value)
        _add_chart(bundle, value)
    bundle["text/plain"] = repr(value)
    return bundle


def display(*objs, raw=False, **_ignored):
    """IPython's `display()`: each object's mime bundle becomes a result of the cell (not the main one), in order."""
    for obj in objs:
        if raw and isinstance(obj, dict):
            bundle = {"is_main_result": False}
            bundle.update({mime: data for mime, data in obj.items() if isinstance(mime, str) and "/" in mime})
        else:
            bundle = _bundle(obj, False)
            if _is_figure(obj):
                _state["shown"].append(obj)
        _state["displayed"].append(bundle)


_globals["display"] = display


class _Displayable:
    """IPython.display's wrappers (`HTML`, `Markdown`, …) for kernels where IPython is not installed."""

    def __init__(self, data=None, url=None, filename=None, **_ignored):
        if data is None and filename is not None:
            with open(filename, "rb" if self._binary else "r") as source:
                data = source.read()
        self.data = data

    _binary = False

    def __repr__(self):
        return "<IPython.core.display.%s object>" % type(self).__name__


def _displayable(name, method, binary=False):
    def render(self):
        return self.data

    return type(name, (_Displayable,), {method: render, "_binary": binary})


def _install_ipython_display():
    """Makes `from IPython.display import display, HTML, …` work (IPython itself is used when it is installed)."""
    import importlib.util
    import types

    if importlib.util.find_spec("IPython") is not None:
        try:
            import IPython.display as shown

            shown.display = display
            import IPython.core.display_functions as functions

            functions.display = display
        except Exception:
            pass
        return
    package = types.ModuleType("IPython")
    module = types.ModuleType("IPython.display")
    module.display = display
    for name, method, binary in (
        ("HTML", "_repr_html_", False), ("Markdown", "_repr_markdown_", False), ("SVG", "_repr_svg_", False),
        ("Latex", "_repr_latex_", False), ("Math", "_repr_latex_", False), ("JSON", "_repr_json_", False),
        ("Image", "_repr_png_", True),
    ):
        setattr(module, name, _displayable(name, method, binary))
    package.display = module
    package.get_ipython = lambda: None  # no IPython shell here (matplotlib and pandas ask)
    sys.modules["IPython"] = package
    sys.modules["IPython.display"] = module


def _is_figure(value):
    module = sys.modules.get("matplotlib.figure")
    return module is not None and isinstance(value, module.Figure)


def _figure_png(figure):
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _add_chart(bundle, figure):
    """The figure's structured chart data (python_charts.py), when it has any; the figure was drawn by savefig."""
    chart = _figure_chart(figure)
    if chart is not None:
        bundle["chart"] = chart


def _open_figures(shown):
    """PNGs of the pyplot figures left open by the cell (then closed)."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    results = []
    for number in pyplot.get_fignums():
        figure = pyplot.figure(number)
        if figure not in shown:
            bundle = {"is_main_result": False, "image/png": _figure_png(figure), "text/plain": repr(figure)}
            _add_chart(bundle, figure)
            results.append(bundle)
    pyplot.close("all")
    return results


def _without_kernel_frames(summary, seen):
    """Drops the kernel's own frames from a TracebackException and the exceptions chained to it."""
    if summary is None or id(summary) in seen:
        return
    seen.add(id(summary))
    summary.stack = traceback.StackSummary.from_list([f for f in summary.stack if f.filename != _KERNEL_FILE])
    _without_kernel_frames(summary.__cause__, seen)
    _without_kernel_frames(summary.__context__, seen)


def _error(exc):
    summary = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    _without_kernel_frames(summary, set())
    lines = []
    for part in summary.format():
        lines.extend(part.rstrip("\n").split("\n"))
    return {"name": type(exc).__name__, "value": str(exc), "traceback": lines}


def _run_cell(code, count):
    filename = "<cell-%d>" % count
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename=filename, mode="exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), _globals)
    if last is None:
        return None
    return eval(compile(last, filename, "eval"), _globals)


def _set_cell_env(env, previous):
    """Sets the cell's own environment variables, noting each one's previous value (None: unset) in `previous`."""
    if not isinstance(env, dict):
        return
    for name, value in env.items():
        previous.setdefault(name, os.environ.get(name))
        os.environ[name] = str(value)


def _restore_env(previous):
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _handle(request):
    _state["count"] += 1
    count = _state["count"]
    _state["id"] = request.get("id")
    results, error = [], None
    previous_env = {}
    _state["displayed"], _state["shown"] = [], []
    _state["in_cell"] = True
    try:
        _set_cell_env(request.get("env") or {}, previous_env)
        value = _run_cell(str(request.get("code", "")), count)
        shown = _state["shown"]
        if value is not None:
            _globals["_"] = value
            if _is_figure(value):
                shown.append(value)
            results.append(_bundle(value, True))
        results = _state["displayed"] + _open_figures(shown) + results
    except BaseException as exc:  # KeyboardInterrupt and SystemExit included: the kernel survives them.
        error = _error(exc)
        results = list(_state["displayed"])
        try:
            _open_figures([])
        except BaseException:
            pass
    finally:
        _state["in_cell"] = False
        _restore_env(previous_env)
    _flush_streams()
    _send({"type": "reply", "id": request.get("id"), "execution_count": count, "results": results, "error": error})


def _preload(names):
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except BaseException:  # a module that cannot be imported (or exits while importing) is simply not preloaded
            pass


def main():
    _install_ipython_display()
    _preload(sys.argv[1:])
    del sys.argv[1:]
    _flush_streams()
    _send({"type": "ready", "language": "python", "pid": os.getpid()})
    while True:
        try:
            line = _requests.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        try:
            request = json.loads(line)
        except ValueError as exc:
            _send({"type": "reply", "id": None, "execution_count": _state["count"], "results": [],
                   "error": {"name": "ProtocolError", "value": str(exc), "traceback": []}})
            continue
        try:
            _handle(request)
        except KeyboardInterrupt:
            # An interrupt that landed after the cell ended but before the reply was sent.
            _state["in_cell"] = False
            _send({"type": "reply", "id": request.get("id"), "execution_count": _state["count"], "results": [],
                   "error": {"name": "KeyboardInterrupt", "value": "", "traceback": []}})


main()
