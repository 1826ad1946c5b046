# The Python zygote of a warm pool member (run as `python3 -c <this> [module ...]` in the background): imports the
# modules given as arguments, then waits for one program on stdin (until EOF). It forks: the child runs the program as
# `__main__` of /tmp/main.py with this process's stdout and stderr; the parent waits and ends as the child ended (the
# same exit code, or the same signal). One zygote serves one run; its sandbox is destroyed afterwards.
import atexit
import os
import signal
import sys
import traceback
import types


def _preload(names):
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except BaseException:  # a module that cannot be imported (even by SystemExit) is simply not preloaded
            pass


def _exit_code(exit):
    """The status `SystemExit(code)` ends the interpreter with: None is 0, an int itself, anything else is printed."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code & 0xFF
    print(exit.code, file=sys.stderr)
    return 1


def _child(source):
    main = types.ModuleType("__main__")
    main.__file__ = "/tmp/main.py"
    main.__cached__ = None
    sys.modules["__main__"] = main
    sys.argv = ["/tmp/main.py"]
    sys.path[0] = "/tmp"
    status = 0
    try:
        code = compile(source, "/tmp/main.py", "exec", dont_inherit=True)
        exec(code, main.__dict__)
    except SystemExit as exit:
        status = _exit_code(exit)
    except BaseException as error:  # noqa: BLE001 - report like the interpreter does, without this file's frames
        tb = error.__traceback__
        tb = None if isinstance(error, SyntaxError) or tb is None else tb.tb_next
        traceback.print_exception(type(error), error, tb)
        status = 1
    # The interpreter's exit without its slow part (tearing down the heap inherited from the zygote).
    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            status = status or 120
    os._exit(status)


def _parent(pid):
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


_preload(sys.argv[1:])
_source = sys.stdin.buffer.read()
_pid = os.fork()
if _pid == 0:
    _child(_source)
else:
    _parent(_pid)
