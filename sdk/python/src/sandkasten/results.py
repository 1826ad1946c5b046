"""Results of running something: a command (`ExecResult`, also what a background command's `wait` returns), a one-shot
run (`RunResult`), a code cell (`CodeResult` with its rich `CellResult`s and `CellError`), and a background command's
description (`CommandInfo`). Fields mirror the API's `ExecResponse`/`ExitEvent`/`CodeResponse`; an exit code other than
0 is a result, not an exception (`ok` and `check()` say whether it succeeded)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .models import Isolation

Json = Dict[str, Any]


@dataclass(frozen=True)
class ResourceUsage:
    """What the sandbox used while the command ran."""

    cpu_user_ms: int = 0
    cpu_system_ms: int = 0
    memory_peak_bytes: int = 0

    @classmethod
    def from_json(cls, body: Optional[Json]) -> ResourceUsage:
        body = body or {}
        return cls(
            cpu_user_ms=int(body.get("cpu_user_ms", 0)),
            cpu_system_ms=int(body.get("cpu_system_ms", 0)),
            memory_peak_bytes=int(body.get("memory_peak_bytes", 0)),
        )


@dataclass(frozen=True)
class PhaseTimings:
    """When each phase of the command ended, in milliseconds from when the server got the request."""

    allocate: float = 0.0
    filesystem_ready: float = 0.0
    runtime_ready: float = 0.0
    first_command: float = 0.0

    @classmethod
    def from_json(cls, body: Optional[Json]) -> PhaseTimings:
        body = body or {}
        return cls(**{key: float(body.get(key, 0.0)) for key in cls.__dataclass_fields__})


class CommandFailed(Exception):
    """Raised by `ExecResult.check()` when the command did not exit 0."""

    def __init__(self, result: ExecResult) -> None:
        super().__init__(f"command failed ({result.describe()}): {result.stderr[-500:]}")
        self.result = result


@dataclass(frozen=True)
class ExecResult:
    """How a command ended and what it wrote."""

    stdout: str  #: standard output as text ("" when it was binary: see stdout_bytes)
    stderr: str
    stdout_bytes: bytes  #: the exact bytes
    stderr_bytes: bytes
    exit_code: Optional[int]  #: set when it exited normally
    signal: Optional[int]  #: set when a signal killed it
    timed_out: bool
    limit: Optional[str]  #: the limit that stopped it: time, memory, output, pids or disk
    oom_killed: bool
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: float
    timings: PhaseTimings
    usage: ResourceUsage
    isolation: Isolation  #: the tier it ran on, why, and (microvm) how the guest ran
    sandbox_id: Optional[str]
    raw: Json = field(repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def describe(self) -> str:
        if self.limit:
            return f"stopped by its {self.limit} limit"
        if self.signal is not None:
            return f"killed by signal {self.signal}"
        return f"exit {self.exit_code}"

    def check(self) -> ExecResult:
        """This result, or CommandFailed when the command did not exit 0."""
        if not self.ok:
            raise CommandFailed(self)
        return self

    @classmethod
    def from_json(cls, body: Json) -> ExecResult:
        """From a JSON `ExecResponse` (stdout and stderr inline)."""
        return cls.from_exit(body, stream_bytes(body, "stdout"), stream_bytes(body, "stderr"))

    @classmethod
    def from_exit(cls, body: Json, stdout: bytes, stderr: bytes) -> ExecResult:
        """From an exit (an `ExitEvent` or `ExecResponse`) and the output collected separately."""
        return cls(
            stdout=_text(stdout),
            stderr=_text(stderr),
            stdout_bytes=stdout,
            stderr_bytes=stderr,
            exit_code=body.get("exit_code"),
            signal=body.get("signal"),
            timed_out=bool(body.get("timed_out", False)),
            limit=body.get("limit"),
            oom_killed=bool(body.get("oom_killed", False)),
            stdout_truncated=bool(body.get("stdout_truncated", False)),
            stderr_truncated=bool(body.get("stderr_truncated", False)),
            duration_ms=float(body.get("duration_ms", 0.0)),
            timings=PhaseTimings.from_json(body.get("phases")),
            usage=ResourceUsage.from_json(body.get("usage")),
            isolation=Isolation.from_json(body.get("isolation")),
            sandbox_id=body.get("sandbox_id"),
            raw=body,
        )


@dataclass(frozen=True)
class RunResult(ExecResult):
    """A one-shot run's result: an ExecResult, plus `error` when it failed before its command (`compile_error`)."""

    error_code: Optional[str] = None
    error_message: Optional[str] = None

    @classmethod
    def from_run(cls, body: Json, stdout: bytes, stderr: bytes) -> RunResult:
        base = ExecResult.from_exit(body, stdout, stderr)
        error = body.get("error") or {}
        values = {key: getattr(base, key) for key in ExecResult.__dataclass_fields__}
        return cls(**values, error_code=error.get("code"), error_message=error.get("message"))


def stream_bytes(body: Json, name: str) -> bytes:
    encoded = body.get(f"{name}_base64")
    if encoded:
        return base64.b64decode(encoded)
    return str(body.get(name, "")).encode("utf-8")


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return ""


@dataclass(frozen=True)
class CellResult:
    """A rich result of a cell: the last expression's value (`is_main_result`) or a figure it left open."""

    is_main_result: bool
    text: Optional[str]  #: text/plain
    html: Optional[str]  #: text/html (a pandas DataFrame)
    png: Optional[bytes]  #: image/png, decoded
    svg: Optional[str]  #: image/svg+xml
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, body: Json) -> CellResult:
        png = body.get("image/png")
        return cls(
            is_main_result=bool(body.get("is_main_result", False)),
            text=body.get("text/plain"),
            html=body.get("text/html"),
            png=base64.b64decode(png) if png else None,
            svg=body.get("image/svg+xml"),
            raw=body,
        )


@dataclass(frozen=True)
class CellError:
    """The exception a cell raised (its class name, message and traceback lines)."""

    name: str
    value: str
    traceback: List[str]

    @classmethod
    def from_json(cls, body: Json) -> CellError:
        return cls(name=body["name"], value=body.get("value", ""), traceback=list(body.get("traceback") or []))


@dataclass(frozen=True)
class CodeResult:
    """What a code cell did: output, rich results, and the error when it raised."""

    context_id: str
    execution_count: int
    stdout: str
    stderr: str
    results: List[CellResult]
    error: Optional[CellError]
    output_truncated: bool
    context_restarted: bool
    duration_ms: float
    raw: Json = field(repr=False, compare=False)

    @property
    def text(self) -> Optional[str]:
        """The last expression's value as text (`text/plain` of the main result), if the cell had one."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None

    @property
    def png(self) -> List[bytes]:
        """Every PNG image among the results (figures first)."""
        return [result.png for result in self.results if result.png is not None]

    @classmethod
    def from_json(cls, body: Json) -> CodeResult:
        error = body.get("error")
        return cls(
            context_id=body["context_id"],
            execution_count=int(body.get("execution_count", 0)),
            stdout=body.get("stdout", ""),
            stderr=body.get("stderr", ""),
            results=[CellResult.from_json(item) for item in body.get("results") or []],
            error=CellError.from_json(error) if error else None,
            output_truncated=bool(body.get("output_truncated", False)),
            context_restarted=bool(body.get("context_restarted", False)),
            duration_ms=float(body.get("duration_ms", 0.0)),
            raw=body,
        )


@dataclass(frozen=True)
class CommandInfo:
    """A background command as `commands.list()` shows it (`CommandBody`)."""

    id: str
    argv: List[str]
    pid: int
    state: str  #: running or exited
    started_at: str
    ended_at: Optional[str]
    exit_code: Optional[int]
    signal: Optional[int]
    timed_out: bool
    limit: Optional[str]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, body: Json) -> CommandInfo:
        return cls(
            id=body["id"],
            argv=list(body.get("argv") or []),
            pid=int(body.get("pid", 0)),
            state=body.get("state", ""),
            started_at=body.get("started_at", ""),
            ended_at=body.get("ended_at"),
            exit_code=body.get("exit_code"),
            signal=body.get("signal"),
            timed_out=bool(body.get("timed_out", False)),
            limit=body.get("limit"),
            raw=body,
        )
