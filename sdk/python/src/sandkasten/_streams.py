"""Server-sent events, without I/O: `SseParser` turns lines into events, and the collectors fold the events of one
stream into its result, calling the caller's callbacks on the way. The exec and command streams send `stdout`/`stderr`
(`OutputEvent`) then `exit` (or `error`); one-shot runs the same with a `RunExitEvent`; code cells `stdout`/`stderr`,
`result`, `error` (the cell's exception), then `end` (the whole `CodeResponse`) or `failure`; template builds
`step`, `output`, `download`, `layer`, `ready`, then `done`, `failed` or `error`. The sync and async
clients share these; a callback may return an awaitable, which the async client awaits (`pending`)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Dict, Generic, Iterator, List, Optional, TypeVar

from .errors import ProtocolError, TemplateBuildFailed, error_from_detail
from .models import TemplateBuild
from .results import CellResult, CodeResult, ExecResult, RunResult

#: A callback for output: gets each chunk as text (binary chunks decoded with replacement characters).
OutputCallback = Callable[[str], Any]
#: A callback for a cell's rich results.
ResultCallback = Callable[[CellResult], Any]

T = TypeVar("T")


@dataclass(frozen=True)
class SseEvent:
    """One server-sent event."""

    event: str
    data: str
    id: Optional[str]

    def json(self) -> Any:
        try:
            return json.loads(self.data)
        except ValueError as error:
            raise ProtocolError("protocol", f"{self.event} event is not JSON: {error}") from None


class SseParser:
    """Feeds lines of an event stream (without their line ends), returns complete events."""

    def __init__(self) -> None:
        self._event = "message"
        self._data: List[str] = []
        self._id: Optional[str] = None

    def feed(self, line: str) -> Optional[SseEvent]:
        if line == "":
            if not self._data:
                self._event = "message"
                return None
            event = SseEvent(self._event, "\n".join(self._data), self._id)
            self._event, self._data = "message", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None


class _Collector(Generic[T]):
    """Output chunks to the callbacks and into buffers; `feed` returns the result once the final event arrived."""

    def __init__(self, on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback]) -> None:
        self._callbacks: Dict[str, Optional[OutputCallback]] = {"stdout": on_stdout, "stderr": on_stderr}
        self._buffers: Dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        #: Awaitables the callbacks returned since the last feed (the async client awaits them).
        self.pending: List[Any] = []
        #: The id of the last event that had one (a byte offset on the command stream: where to resume).
        self.last_id: Optional[str] = None

    def _call(self, callback: Optional[Callable[[Any], Any]], value: Any) -> None:
        if callback is not None:
            outcome = callback(value)
            if outcome is not None and hasattr(outcome, "__await__"):
                self.pending.append(outcome)

    def _output(self, event: SseEvent) -> bool:
        if event.event not in self._buffers:
            return False
        body = event.json()
        encoded = body.get("base64")
        data = base64.b64decode(encoded) if encoded else str(body.get("data", "")).encode("utf-8")
        self._buffers[event.event] += data
        self._call(self._callbacks[event.event], data.decode("utf-8", "replace"))
        return True

    def output(self, name: str) -> bytes:
        return bytes(self._buffers[name])

    def feed(self, event: SseEvent) -> Optional[T]:
        if event.id is not None:
            self.last_id = event.id
        if self._output(event):
            return None
        return self._final(event)

    def _final(self, event: SseEvent) -> Optional[T]:
        raise NotImplementedError

    def ended_early(self) -> ProtocolError:
        return ProtocolError("protocol", "the event stream ended before its final event")


class ExecCollector(_Collector[ExecResult]):
    """A command's stream (exec with `Accept: text/event-stream`, or a background command's stream)."""

    def __init__(self, on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback], sandbox_id: str):
        super().__init__(on_stdout, on_stderr)
        self._sandbox_id = sandbox_id

    def _final(self, event: SseEvent) -> Optional[ExecResult]:
        if event.event == "exit":
            body = dict(event.json())
            body.setdefault("sandbox_id", self._sandbox_id)
            return ExecResult.from_exit(body, self.output("stdout"), self.output("stderr"))
        if event.event == "error":
            raise error_from_detail(event.json())
        return None


class RunCollector(_Collector[RunResult]):
    """A one-shot run's stream."""

    def _final(self, event: SseEvent) -> Optional[RunResult]:
        if event.event == "exit":
            return RunResult.from_run(event.json(), self.output("stdout"), self.output("stderr"))
        if event.event == "error":
            raise error_from_detail(event.json())
        return None


class CodeCollector(_Collector[CodeResult]):
    """A code cell's stream."""

    def __init__(
        self,
        on_stdout: Optional[OutputCallback],
        on_stderr: Optional[OutputCallback],
        on_result: Optional[ResultCallback],
    ) -> None:
        super().__init__(on_stdout, on_stderr)
        self._on_result = on_result

    def _final(self, event: SseEvent) -> Optional[CodeResult]:
        if event.event == "result":
            self._call(self._on_result, CellResult.from_json(event.json()))
        elif event.event == "end":
            return CodeResult.from_json(event.json())
        elif event.event == "failure":
            raise error_from_detail(event.json())
        return None


class TemplateBuildCollector(_Collector[TemplateBuild]):
    """A template build's stream: each event to `on_event` (a dict, its `event` field names it), each step's output
    to `on_output`; `done` is the result, `failed` raises `TemplateBuildFailed`, `error` the server's error."""

    def __init__(self, on_output: Optional[OutputCallback], on_event: Optional[Callable[[Any], Any]]) -> None:
        super().__init__(None, None)
        self._on_output = on_output
        self._on_event = on_event
        self._steps: List[Any] = []

    def _final(self, event: SseEvent) -> Optional[TemplateBuild]:
        body = event.json()
        if event.event == "error":
            raise error_from_detail(body)
        self._call(self._on_event, body)
        if event.event == "output":
            self._call(self._on_output, str(body.get("data", "")))
        elif event.event == "step":
            self._steps.append(body)
        elif event.event == "failed":
            raise TemplateBuildFailed(str(body.get("message", "")), body.get("step"), str(body.get("output", "")))
        elif event.event == "done":
            return TemplateBuild(
                name=body["name"],
                digest=body["digest"],
                layers=list(body.get("layers") or []),
                size_bytes=int(body.get("size_bytes") or 0),
                steps=self._steps,
            )
        return None


def drain(events: Iterator[SseEvent], collector: _Collector[T]) -> T:
    """Feeds `events` to `collector` until its result; the stream (and its connection) is closed either way."""
    try:
        for event in events:
            result = collector.feed(event)
            if result is not None:
                return result
        raise collector.ended_early()
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


async def adrain(events: AsyncIterator[SseEvent], collector: _Collector[T]) -> T:
    """`drain` for an async stream: awaits what async callbacks returned, in order, after each event, and closes the
    stream before returning (an async generator left suspended would hold its connection until garbage collection)."""
    try:
        async for event in events:
            result = collector.feed(event)
            while collector.pending:
                await collector.pending.pop(0)
            if result is not None:
                return result
        raise collector.ended_early()
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
