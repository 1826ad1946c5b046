"""sandkasten R kernel: one long-running R session per code context, driven by this Python program.

Protocol: as python_kernel.py (one JSON object per line; stdin: {"id", "code", "env"}; stdout: "ready", "stream",
"reply"). The R session (`R --no-echo`, non-interactive, run from `R_PROGRAM` below, which it reads from a pipe) keeps
its global environment across cells. It reads one command per line from a pipe of its own (its stdin is /dev/null):
the cell's code and its env, each field hex-encoded. It parses the cell and evaluates each top-level expression in
the global environment with `withVisible`, as the R console does: a visible value is printed to stdout, except the
last expression's, which is the cell's result (`text/plain`: what `print` (`show` for S4 objects) writes, e.g.
`[1] 42`). Warnings are printed as they happen (`options(warn = 1)`), to stderr, as messages are. Plotting opens a
PNG file device (the `device` option), closed at the end of the cell: each page becomes an `image/png` result (as
IRkernel shows them); a device the cell opens itself (`pdf(...)`) is its own. An error ends the cell: its name is the
condition's class (`Error` for a plain `stop()`), its value the message, its traceback "Error in <call> : <message>"
and the calls, innermost first, as R's `traceback()` prints them.

After a cell R writes a sync token on stdout and stderr (everything before it has been forwarded) and its answer on a
descriptor of its own: length-prefixed fields ("NAME BYTES\\n" then the bytes; "end 0\\n" last).

SIGINT (the host's interrupt, sent to the whole process group) raises R's `interrupt` condition in the running cell,
which ends it as a `KeyboardInterrupt` error; the session survives. An interrupt that lands between cells stays
pending in R until it next checks (it does not stop a blocking read), so every cell first lets one pending interrupt
go off (`Sys.sleep(0)` inside a handler). This program ignores SIGINT.
"""

import base64
import codecs
import json
import os
import select
import signal
import subprocess
import sys
import threading

_requests = os.fdopen(os.dup(0), "rb", buffering=0)
_channel_fd = os.dup(1)
_channel_lock = threading.Lock()
_state = {"id": None, "count": 0}
# No NUL bytes: an R string cannot hold one. \x01 and 16 random bytes do not turn up in output by chance.
_TOKEN = "\x01sandkasten-sync-%s\x01" % os.urandom(16).hex()

# The R session's program: one expression (so the global environment holds only what cells define) that returns when
# the commands end; commandArgs: the command pipe's fd, the answer pipe's fd, the sync token.
R_PROGRAM = r"""
local({
    arguments <- commandArgs(trailingOnly = TRUE)
    commands <- file(sprintf("/proc/self/fd/%s", arguments[[1]]), open = "r", raw = TRUE)
    answers <- file(sprintf("/proc/self/fd/%s", arguments[[2]]), open = "wb", raw = TRUE)
    token <- arguments[[3]]
    # The sync tokens go to fds 1 and 2 themselves, past any sink() a cell left open.
    output <- file("/proc/self/fd/1", open = "w", raw = TRUE)
    errors <- file("/proc/self/fd/2", open = "w", raw = TRUE)
    plots <- file.path(tempdir(), "sandkasten-plots")
    dir.create(plots, showWarnings = FALSE)
    # The devices plotting opened during the cell (not those the cell opened itself, e.g. a pdf() it writes to).
    opened <- integer()
    options(warn = 1, device = function(...) {
        pattern <- sprintf("plot-%03d-%%03d.png", length(opened) + 1L)
        grDevices::png(file.path(plots, pattern), width = 7, height = 5, units = "in", res = 96)
        opened <<- c(opened, grDevices::dev.cur())
    })
    close_plots <- function() {
        for (device in intersect(opened, grDevices::dev.list())) grDevices::dev.off(device)
        opened <<- integer()
    }

    from_hex <- function(field) {
        text <- substring(field, 2L)
        if (!nzchar(text)) return("")
        starts <- seq.int(1L, nchar(text), by = 2L)
        string <- rawToChar(as.raw(strtoi(substring(text, starts, starts + 1L), 16L)))
        Encoding(string) <- "UTF-8"
        string
    }
    send <- function(fields) {
        for (index in seq_along(fields)) {
            bytes <- charToRaw(enc2utf8(fields[[index]]))
            writeBin(charToRaw(sprintf("%s %d\n", names(fields)[[index]], length(bytes))), answers)
            writeBin(bytes, answers)
        }
        writeBin(charToRaw("end 0\n"), answers)
        flush(answers)
    }
    show_value <- function(value) if (isS4(value)) methods::show(value) else print(value)
    # Marks where a top-level expression's evaluation starts in the call stack (a traceback starts below it).
    evaluate <- function(expression) eval(expression, globalenv())
    # The call a condition signalled by a top-level expression itself (`stop("x")` in the cell) names.
    top_level <- quote(eval(expression, globalenv()))
    call_of <- function(condition) {
        call <- conditionCall(condition)
        if (identical(call, top_level)) NULL else call
    }
    traceback_of <- function(calls, functions) {
        start <- Position(function(f) identical(f, evaluate), functions, right = TRUE)
        if (is.na(start)) return(NULL)
        # evaluate(), then eval() twice, then the cell's own calls; the handler's frames last.
        own <- seq_len(length(calls) - 1L)
        own <- own[own > start + 2L]
        own <- own[!vapply(functions[own], identical, logical(1), base::.handleSimpleError)]
        lines <- vapply(calls[own], function(call) paste(deparse(call, nlines = 3L), collapse = "\n"), "")
        rev(sprintf("%d: %s", seq_along(lines), lines))
    }
    describe <- function(condition, stack) {
        message <- conditionMessage(condition)
        calls <- traceback_of(stack$calls, stack$functions)
        # Outside the cell's own expressions (parsing it, setting its env) the kernel's call says nothing.
        call <- if (is.null(calls)) NULL else call_of(condition)
        head <- if (is.null(call)) sprintf("Error: %s", message)
                else sprintf("Error in %s : %s", paste(deparse(call, nlines = 1L), collapse = ""), message)
        name <- class(condition)[[1]]
        if (name %in% c("simpleError", "error")) name <- "Error"
        list(name = name, value = message, traceback = c(head, calls))
    }
    run_cell <- function(code) {
        expressions <- parse(text = code, keep.source = TRUE)
        result <- NULL
        for (index in seq_along(expressions)) {
            shown <- withVisible(evaluate(expressions[[index]]))
            if (!shown$visible) next
            if (index == length(expressions)) {
                result <- utils::capture.output(show_value(shown$value))
            } else {
                show_value(shown$value)
            }
        }
        result
    }
    # The cell's env set, returning what to put back: each name's previous value, NA where it was unset.
    set_env <- function(fields) {
        if (length(fields) < 2L) return(character())
        names <- vapply(fields[c(TRUE, FALSE)], from_hex, "")
        values <- vapply(fields[c(FALSE, TRUE)], from_hex, "")
        previous <- Sys.getenv(names, unset = NA, names = TRUE)
        do.call(Sys.setenv, as.list(stats::setNames(values, names)))
        previous
    }
    restore_env <- function(previous) {
        for (name in names(previous)) {
            if (is.na(previous[[name]])) Sys.unsetenv(name)
            else do.call(Sys.setenv, stats::setNames(list(previous[[name]]), name))
        }
    }
    interrupted <- function(condition) {
        list(error = list(name = "KeyboardInterrupt", value = "the cell was interrupted", traceback = character()))
    }
    answer_cell <- function(line) {
        fields <- strsplit(line, " ", fixed = TRUE)[[1]]
        stack <- NULL
        previous <- character()
        outcome <- tryCatch({
            previous <- set_env(fields[-1L])
            list(value = withCallingHandlers(run_cell(from_hex(fields[[1]])), error = function(e) {
                calls <- sys.calls()
                stack <<- list(calls = calls, functions = lapply(seq_along(calls), sys.function))
            }, warning = function(w) {
                # As the console prints a warning at the top level, without the kernel's call.
                if (!is.null(conditionCall(w)) && is.null(call_of(w))) {
                    cat("Warning:", conditionMessage(w), "\n", file = stderr())
                    invokeRestart("muffleWarning")
                }
            }))
        }, error = function(e) list(error = describe(e, stack)), interrupt = interrupted,
        finally = restore_env(previous))
        close_plots()
        answer <- list()
        for (plot in sort(list.files(plots, full.names = TRUE))) answer <- c(answer, list(plot = plot))
        if (length(outcome$value)) answer$value <- paste(outcome$value, collapse = "\n")
        if (!is.null(outcome$error)) {
            answer$error_name <- outcome$error$name
            answer$error_value <- outcome$error$value
            answer$traceback <- paste(outcome$error$traceback, collapse = "\n")
        }
        answer
    }

    send(list(ready = ""))
    repeat {
        line <- tryCatch(readLines(commands, n = 1L), interrupt = function(condition) NA_character_)
        if (!length(line)) break
        if (is.na(line)) next
        answer <- tryCatch({
            # An interrupt that landed between cells is pending: it goes off here, not in this cell.
            tryCatch(Sys.sleep(0), interrupt = function(condition) NULL)
            answer_cell(line)
        }, interrupt = function(condition) {
            list(error_name = "KeyboardInterrupt", error_value = "the cell was interrupted")
        }, error = function(e) list(error_name = "KernelError", error_value = conditionMessage(e)))
        cat(token, file = output)
        flush(output)
        cat(token, file = errors)
        flush(errors)
        send(answer)
    }
})
"""


def _send(message):
    data = (json.dumps(message, ensure_ascii=False) + "\n").encode("utf-8", "replace")
    with _channel_lock:
        view = memoryview(data)
        while view:
            view = view[os.write(_channel_fd, view):]


class _Forwarder(threading.Thread):
    """Forwards one of R's output pipes as "stream" messages; releases `synced` at each sync token."""

    def __init__(self, name, pipe):
        super().__init__(daemon=True)
        self.stream_name, self.fd = name, pipe.fileno()
        self.synced = threading.Semaphore(0)
        self.token = _TOKEN.encode()
        self._pipe = pipe

    def _read(self):
        """What R wrote next: R flushes every piece it prints (`cat(1, "\\n")` is three writes), so a piece that does
        not end a line waits briefly for the rest of it, and the line goes out as one message."""
        chunk = os.read(self.fd, 65536)
        while chunk and not chunk.endswith((b"\n", self.token)) and len(chunk) < 65536:
            if not select.select([self.fd], [], [], 0.01)[0]:
                break
            more = os.read(self.fd, 65536)
            if not more:
                break
            chunk += more
        return chunk

    def run(self):
        token = self.token
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = b""
        while True:
            chunk = self._read()
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


def _read_answer(answers):
    """One answer of R's: a list of (name, bytes) fields, or None when R has ended."""
    fields = []
    while True:
        header = answers.readline()
        if not header:
            return None
        name, _, size = header.decode("ascii", "replace").strip().partition(" ")
        if name == "end":
            return fields
        data = answers.read(int(size or 0))
        if data is None:
            return None
        fields.append((name, data))


def _command(request):
    """The line R reads for `request`: its code, then each env variable's name and value, hex-encoded."""
    parts = [str(request.get("code", ""))]
    env = request.get("env")
    if isinstance(env, dict):
        for name, value in env.items():
            parts += [str(name), str(value)]
    return (" ".join("x" + part.encode("utf-8", "replace").hex() for part in parts) + "\n").encode("ascii")


def _reply(fields):
    """The protocol's reply for R's answer fields: plots (PNG files R wrote), the value, the error."""
    results, error, text = [], None, {}
    for name, data in fields:
        if name == "plot":
            path = data.decode("utf-8", "replace")
            try:
                with open(path, "rb") as plot:
                    png = base64.b64encode(plot.read()).decode("ascii")
                os.unlink(path)
            except OSError:
                continue
            results.append({"is_main_result": False, "image/png": png, "text/plain": "plot without title"})
        else:
            text[name] = data.decode("utf-8", "replace")
    if "value" in text:
        results.append({"is_main_result": True, "text/plain": text["value"]})
    if "error_name" in text:
        traceback = text.get("traceback", "")
        error = {"name": text["error_name"], "value": text.get("error_value", ""),
                 "traceback": traceback.split("\n") if traceback else []}
    return results, error


def main():
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    program_read, program_write = os.pipe()
    commands_read, commands_write = os.pipe()
    answers_read, answers_write = os.pipe()
    # The program fits in the pipe's buffer: R reads it once it starts.
    os.write(program_write, R_PROGRAM.encode("utf-8"))
    os.close(program_write)
    r_session = subprocess.Popen(
        ["R", "--no-save", "--no-restore", "--quiet", "--no-echo", "--file=/proc/self/fd/%d" % program_read,
         "--args", str(commands_read), str(answers_write), _TOKEN],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        pass_fds=(program_read, commands_read, answers_write),
    )
    for fd in (program_read, commands_read, answers_write):
        os.close(fd)
    commands = os.fdopen(commands_write, "wb", buffering=0)
    answers = os.fdopen(answers_read, "rb")
    if _read_answer(answers) is None:
        # R did not start: its own words say why (the host shows a kernel's stderr from before "ready").
        sys.stderr.write(r_session.stderr.read().decode("utf-8", "replace"))
        sys.exit("the R session ended with status %s before it was ready" % r_session.wait())
    forwarders = [_Forwarder("stdout", r_session.stdout), _Forwarder("stderr", r_session.stderr)]
    for forwarder in forwarders:
        forwarder.start()
    _send({"type": "ready", "language": "r", "pid": os.getpid()})
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
        try:
            commands.write(_command(request))
            fields = _read_answer(answers)
        except OSError:
            fields = None
        for forwarder in forwarders:
            forwarder.synced.acquire(timeout=5)
        if fields is None:
            _send({"type": "reply", "id": _state["id"], "execution_count": _state["count"], "results": [],
                   "error": {"name": "RExited", "value": "the R session ended (status %s)" % r_session.wait(),
                             "traceback": []}})
            break
        results, error = _reply(fields)
        _send({"type": "reply", "id": _state["id"], "execution_count": _state["count"], "results": results,
               "error": error})
    # Without commands R's loop ends and R exits as usual, removing its temporary directory.
    commands.close()
    try:
        r_session.wait(timeout=5)
    except subprocess.TimeoutExpired:
        r_session.kill()
    sys.exit(0)


main()
