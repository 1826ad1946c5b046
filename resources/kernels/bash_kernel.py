"""sandkasten bash kernel: one long-running bash per code context, driven by this Python program.

Protocol: as python_kernel.py (one JSON object per line; stdin: {"id", "code", "env"}; stdout: "ready", "stream",
"reply"). Each cell is written to a file that the bash `source`s, so variables, functions, the working directory and
exports persist across cells. The bash reads its commands from a pipe of its own (its stdin is /dev/null, so a cell's
`cat` cannot eat the next cell); after a cell it writes a sync token on stdout and stderr (everything before it has
been forwarded) and the cell's exit status on a descriptor of its own. A non-zero status is the cell's error (name
"Error", value the status, as bash_kernel reports it). A cell has no result value, only its output.

SIGINT (the host's interrupt, sent to the whole process group) stops the running command and the rest of the cell
(the shell's trap returns from the sourced file), not the shell; this program ignores it.
"""

import codecs
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading

_requests = os.fdopen(os.dup(0), "rb", buffering=0)
_channel_fd = os.dup(1)
_channel_lock = threading.Lock()
_state = {"id": None, "count": 0}
_TOKEN = "\x00sandkasten-sync-%s\x00" % os.urandom(8).hex()


def _send(message):
    data = (json.dumps(message, ensure_ascii=False) + "\n").encode("utf-8", "replace")
    with _channel_lock:
        view = memoryview(data)
        while view:
            view = view[os.write(_channel_fd, view):]


class _Forwarder(threading.Thread):
    """Forwards one of the bash's output pipes as "stream" messages; releases `synced` at each sync token."""

    def __init__(self, name, pipe):
        super().__init__(daemon=True)
        self.stream_name, self.fd = name, pipe.fileno()
        self.synced = threading.Semaphore(0)
        self._pipe = pipe

    def run(self):
        token = _TOKEN.encode()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = b""
        while True:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.synced.release()
                return
            pending += chunk
            while True:
                at = pending.find(token)
                if at < 0:
                    break
                self._emit(decoder.decode(pending[:at]))
                pending = pending[at + len(token):]
                self.synced.release()
            keep = 0
            for size in range(min(len(token) - 1, len(pending)), 0, -1):
                if token.startswith(pending[-size:]):
                    keep = size
                    break
            self._emit(decoder.decode(pending[: len(pending) - keep]))
            pending = pending[len(pending) - keep:]

    def _emit(self, text):
        if text:
            _send({"type": "stream", "id": _state["id"], "name": self.stream_name, "text": text})


def _env_lines(env):
    """Shell lines that set the cell's variables (names are POSIX names: the host checked them) and that put them
    back after it."""
    before, after = [], []
    for name, value in (env or {}).items():
        before.append('if [ "${%s+set}" = set ]; then __sk_had_%s=1; __sk_was_%s=$%s; else __sk_had_%s=; fi'
                      % (name, name, name, name, name))
        before.append("export %s=%s" % (name, shlex.quote(str(value))))
        after.append('if [ -n "$__sk_had_%s" ]; then export %s="$__sk_was_%s"; else unset %s; fi; unset __sk_had_%s __sk_was_%s'
                     % (name, name, name, name, name, name))
    return before, after


def main():
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    commands_read, commands_write = os.pipe()
    status_read, status_write = os.pipe()
    cells = tempfile.mkdtemp(prefix="sandkasten-bash-")
    bash = subprocess.Popen(
        ["bash", "--noprofile", "--norc", "/proc/self/fd/%d" % commands_read],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        pass_fds=(commands_read, status_write),
    )
    os.close(commands_read)
    os.close(status_write)
    commands = os.fdopen(commands_write, "wb", buffering=0)
    statuses = os.fdopen(status_read, "rb", buffering=0)
    forwarders = [_Forwarder("stdout", bash.stdout), _Forwarder("stderr", bash.stderr)]
    for forwarder in forwarders:
        forwarder.start()
    commands.write(b"trap 'return 130 2>/dev/null' INT\n")
    _send({"type": "ready", "language": "bash", "pid": os.getpid()})
    while True:
        line = _requests.readline()
        if not line:
            break
        try:
            request = json.loads(line)
        except ValueError as exc:
            _send({"type": "reply", "id": None, "execution_count": _state["count"], "results": [],
                   "error": {"name": "ProtocolError", "value": str(exc), "traceback": []}})
            continue
        _state["count"] += 1
        _state["id"] = request.get("id")
        path = os.path.join(cells, "cell-%d.sh" % _state["count"])
        with open(path, "w", encoding="utf-8") as cell:
            cell.write(str(request.get("code", "")) + "\n")
        before, after = _env_lines(request.get("env"))
        # The token holds NUL bytes, which a shell word cannot: printf writes them from octal escapes.
        octal = "".join("\\%03o" % byte for byte in _TOKEN.encode())
        script = before + ["source %s" % shlex.quote(path), "__sk_status=$?"] + after + [
            "rm -f %s" % shlex.quote(path),
            "printf '%s'; printf '%s' >&2; printf '%%d\\n' \"$__sk_status\" >&%d" % (octal, octal, status_write),
        ]
        commands.write(("\n".join(script) + "\n").encode("utf-8"))
        status_line = statuses.readline()
        for forwarder in forwarders:
            forwarder.synced.acquire(timeout=5)
        if not status_line:
            _send({"type": "reply", "id": _state["id"], "execution_count": _state["count"], "results": [],
                   "error": {"name": "BashExited", "value": "the shell ended", "traceback": []}})
            break
        status = int(status_line.strip() or b"0")
        error = None if status == 0 else {"name": "Error", "value": str(status), "traceback": []}
        _send({"type": "reply", "id": _state["id"], "execution_count": _state["count"], "results": [], "error": error})
    bash.kill()
    sys.exit(0)


main()
