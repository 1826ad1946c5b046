"""The async `AsyncSandbox`, `Sandbox` (sandbox.py) over asyncio with the same methods, each a coroutine:
`sbx = await AsyncSandbox.create(...)`, or `async with AsyncSandbox.create(...) as sbx:` which kills it on exit.
Output callbacks may be plain functions or coroutine functions (their coroutines are awaited in order)."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Awaitable, Dict, Generator, List, Literal, Mapping, Optional, Sequence, Tuple, Type, Union, overload

from . import _bodies
from ._http import DEFAULT_TIMEOUT, AsyncTransport, json_of
from ._operations import op, uses
from ._streams import CodeCollector, ExecCollector, OutputCallback, ResultCallback, adrain
from .aio_files import AsyncFiles
from .errors import NotFound
from .models import (
    ContextInfo,
    EgressEvent,
    Isolation,
    LimitsLike,
    NetworkLike,
    NetworkPolicy,
    SandboxInfo,
    SandboxMetrics,
    SnapshotInfo,
    network_json,
)
from .results import CodeResult, CommandInfo, ExecResult


class AsyncSandbox:
    """A sandbox on a sandkasten server."""

    def __init__(self, info: SandboxInfo, transport: AsyncTransport, owns_transport: bool = False) -> None:
        self.info = info
        self._transport = transport
        self._owns_transport = owns_transport
        self._path = {"id": info.id}
        self.files = AsyncFiles(transport, info.id)
        self.commands = AsyncCommands(self)
        self.contexts = AsyncContexts(transport, info.id)

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def isolation(self) -> Isolation:
        return self.info.isolation

    # Lifecycle -------------------------------------------------------------------------------------------------------

    @classmethod
    @uses("sandboxes.create")
    def create(
        cls,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        isolation: Optional[str] = None,
        template: Optional[str] = None,
        limits: Optional[LimitsLike] = None,
        network: Optional[NetworkLike] = None,
        env: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        timeout: Optional[int] = None,
        secrets: Optional[Sequence[str]] = None,
        snapshot: Optional[str] = None,
        auto_pause: bool = False,
        auto_resume: bool = False,
        pause_mode: str = "memory",
        request_timeout: float = DEFAULT_TIMEOUT,
    ) -> Creating:
        """Creates a sandbox (`timeout` is its lifetime in seconds; `snapshot` an `sn-…` id to start on): await the
        answer, or use it as `async with` to have the sandbox killed at the end of the block."""
        body = _bodies.create_body(
            isolation=isolation,
            template=template,
            limits=limits,
            network=network,
            env=env,
            metadata=metadata,
            timeout=timeout,
            secrets=secrets,
            snapshot=snapshot,
            auto_pause=auto_pause,
            auto_resume=auto_resume,
            pause_mode=pause_mode,
        )
        return Creating(cls._create_owned(url, api_key, request_timeout, body))

    @classmethod
    async def _create_owned(
        cls, url: Optional[str], api_key: Optional[str], request_timeout: float, body: Dict[str, Any]
    ) -> AsyncSandbox:
        transport = AsyncTransport(url, api_key, request_timeout)
        try:
            return await cls._created(transport, body, owns_transport=True)
        except BaseException:
            await transport.close()
            raise

    @classmethod
    async def _created(cls, transport: AsyncTransport, body: Dict[str, Any], owns_transport: bool) -> AsyncSandbox:
        response = await transport.request(op("sandboxes.create"), {}, json=body, long=True)
        return cls(SandboxInfo.from_json(json_of(response)), transport, owns_transport)

    @classmethod
    @uses("sandboxes.get")
    async def connect(
        cls,
        sandbox_id: str,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        request_timeout: float = DEFAULT_TIMEOUT,
    ) -> AsyncSandbox:
        """Attaches to an existing sandbox of the key's tenant (NotFound when there is none)."""
        transport = AsyncTransport(url, api_key, request_timeout)
        try:
            response = await transport.request(op("sandboxes.get"), {"id": sandbox_id})
            return cls(SandboxInfo.from_json(json_of(response)), transport, owns_transport=True)
        except BaseException:
            await transport.close()
            raise

    @uses("sandboxes.get")
    async def refresh(self) -> SandboxInfo:
        """Fetches the sandbox's current description (state, expiry) into `info`."""
        return self._update(await self._transport.request(op("sandboxes.get"), self._path))

    @uses("sandboxes.delete")
    async def kill(self) -> None:
        """Destroys the sandbox (killing one that has already ended changes nothing)."""
        await self._transport.request(op("sandboxes.delete"), self._path)

    @uses("sandboxes.set_timeout")
    async def set_timeout(self, seconds: int) -> SandboxInfo:
        """The sandbox is destroyed `seconds` from now."""
        response = await self._transport.request(
            op("sandboxes.set_timeout"), self._path, json={"timeout_s": int(seconds)}
        )
        return self._update(response)

    @uses("sandboxes.pause")
    async def pause(self, *, mode: str = "memory") -> SandboxInfo:
        """Pauses it. `mode="memory"`: with its processes (process tier: frozen; gVisor: checkpointed to disk);
        `mode="filesystem"`: its files saved, everything else released (the resume starts fresh processes on them).
        Requests then fail with `Paused`."""
        body: Dict[str, Any] = {"mode": mode}
        return self._update(await self._transport.request(op("sandboxes.pause"), self._path, json=body, long=True))

    @uses("sandboxes.resume")
    async def resume(self) -> SandboxInfo:
        """Resumes a paused sandbox: where it was, or (paused with `mode="filesystem"`) on its files."""
        return self._update(await self._transport.request(op("sandboxes.resume"), self._path, long=True))

    @uses("sandboxes.snapshot")
    async def snapshot(self, *, memory: bool = False, name: Optional[str] = None) -> SnapshotInfo:
        """Saves its files (and with `memory=True`, on tiers that can, its processes) as a snapshot."""
        body: Dict[str, Any] = {"memory": memory}
        if name is not None:
            body["name"] = name
        response = await self._transport.request(op("sandboxes.snapshot"), self._path, json=body, long=True)
        return SnapshotInfo.from_json(json_of(response))

    @uses("sandboxes.fork")
    async def fork(self, count: int = 1, *, timeout: Optional[int] = None) -> List[AsyncSandbox]:
        """Independent copies of the running sandbox (each its own AsyncSandbox; kill them when done)."""
        body: Dict[str, Any] = {"count": count}
        if timeout is not None:
            body["timeout_s"] = int(timeout)
        response = await self._transport.request(op("sandboxes.fork"), self._path, json=body, long=True)
        copies = json_of(response).get("sandboxes", [])
        return [
            AsyncSandbox(SandboxInfo.from_json(item), self._transport.sibling(), owns_transport=True) for item in copies
        ]

    def _update(self, response: Any) -> SandboxInfo:
        self.info = SandboxInfo.from_json(json_of(response))
        return self.info

    async def close(self) -> None:
        """Closes the HTTP connections (the sandbox keeps running: `kill()` destroys it)."""
        if self._owns_transport:
            await self._transport.close()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        try:
            await self.kill()
        except NotFound:
            pass  # already gone (expired and forgotten by the server): nothing left to kill
        finally:
            await self.close()

    # Commands --------------------------------------------------------------------------------------------------------

    @overload
    async def exec(
        self,
        command: _bodies.Command,
        *,
        cwd: Optional[str] = ...,
        env: Optional[Mapping[str, str]] = ...,
        stdin: Optional[str] = ...,
        timeout: Optional[float] = ...,
        on_stdout: Optional[OutputCallback] = ...,
        on_stderr: Optional[OutputCallback] = ...,
        background: Literal[False] = ...,
        pty: Optional[Tuple[int, int]] = ...,
    ) -> ExecResult: ...

    @overload
    async def exec(
        self,
        command: _bodies.Command,
        *,
        cwd: Optional[str] = ...,
        env: Optional[Mapping[str, str]] = ...,
        stdin: Optional[str] = ...,
        timeout: Optional[float] = ...,
        on_stdout: Optional[OutputCallback] = ...,
        on_stderr: Optional[OutputCallback] = ...,
        background: Literal[True],
        pty: Optional[Tuple[int, int]] = ...,
    ) -> AsyncCommandHandle: ...

    @uses("exec")
    async def exec(
        self,
        command: _bodies.Command,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Optional[str] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        background: bool = False,
        pty: Optional[Tuple[int, int]] = None,
    ) -> Union[ExecResult, AsyncCommandHandle]:
        """Runs `command` (a shell line, or an argv list) and returns how it ended. With `on_stdout`/`on_stderr` the
        output streams to them as it comes; with `background=True` it returns an AsyncCommandHandle at once. `timeout`
        is in seconds (default and maximum: the sandbox's `limits.timeout_ms`); `cwd` defaults to `/workspace`. `pty=(cols,
        rows)` runs it on a pseudo-terminal of that size: all its output is stdout, `resize` changes the size."""
        body = _bodies.exec_body(
            command, cwd=cwd, env=env, stdin=stdin, timeout=timeout, background=background, pty=pty
        )
        if background:
            started = json_of(await self._transport.request(op("exec"), self._path, json=body))
            return AsyncCommandHandle(self, started["command_id"], started.get("pid"), started.get("started_at"))
        if on_stdout is None and on_stderr is None:
            response = await self._transport.request(op("exec"), self._path, json=body, long=True)
            return ExecResult.from_json(json_of(response))
        collector = ExecCollector(on_stdout, on_stderr, self.id)
        return await adrain(self._transport.stream(op("exec"), self._path, json=body), collector)

    # Code ------------------------------------------------------------------------------------------------------------

    @uses("code.run")
    async def run_code(
        self,
        code: str,
        language: Optional[str] = None,
        *,
        context: Union[str, ContextInfo, None] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        on_result: Optional[ResultCallback] = None,
    ) -> CodeResult:
        """Runs a cell in a stateful context (`language` "python" or "javascript", or the language of `context`) and
        returns its output, rich results (`text` is the last expression's value) and error. Without `language` or
        `context` it runs in the default Python context."""
        context_id = context.id if isinstance(context, ContextInfo) else context
        if language is None and context_id is None:
            language = "python"
        body = _bodies.code_body(code, language, context_id, timeout)
        if on_stdout is None and on_stderr is None and on_result is None:
            response = await self._transport.request(op("code.run"), self._path, json=body, long=True)
            return CodeResult.from_json(json_of(response))
        collector = CodeCollector(on_stdout, on_stderr, on_result)
        return await adrain(self._transport.stream(op("code.run"), self._path, json=body), collector)

    # Network ---------------------------------------------------------------------------------------------------------

    @uses("network.set")
    async def set_network(self, policy: NetworkLike) -> NetworkPolicy:
        """Changes the network policy; new connections follow it at once (`none` also cuts open ones)."""
        response = await self._transport.request(op("network.set"), self._path, json=network_json(policy))
        return NetworkPolicy.from_json(json_of(response))

    @uses("sandboxes.metrics")
    async def metrics(self, *, from_ms: Optional[int] = None, to_ms: Optional[int] = None) -> SandboxMetrics:
        """Its usage samples (CPU share, memory, disk), oldest first, with one taken now while it runs."""
        params = {"from_ms": from_ms, "to_ms": to_ms}
        response = await self._transport.request(op("sandboxes.metrics"), self._path, params=params)
        return SandboxMetrics.from_json(json_of(response))

    @uses("network.egress")
    async def egress(self, limit: Optional[int] = None) -> List[EgressEvent]:
        """The egress audit: every connection attempt through the proxy with its decision, oldest first."""
        response = await self._transport.request(op("network.egress"), self._path, params={"limit": limit})
        return [EgressEvent.from_json(item) for item in json_of(response).get("events", [])]

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r}, isolation={self.isolation!r})"


class AsyncCommandHandle:
    """A background command: stream or wait for it, write to its stdin, signal or kill it."""

    def __init__(self, sandbox: AsyncSandbox, command_id: str, pid: Optional[int], started_at: Optional[str]) -> None:
        self.sandbox = sandbox
        self.id = command_id
        self.pid = pid
        self.started_at = started_at
        self._path = {"id": sandbox.id, "command_id": command_id}

    @uses("commands.stream")
    async def wait(
        self,
        *,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        since: int = 0,
    ) -> ExecResult:
        """Follows its output from byte offset `since` (what is retained, then live) until it exits."""
        transport = self.sandbox._transport
        collector = ExecCollector(on_stdout, on_stderr, self.sandbox.id)
        return await adrain(
            transport.stream(op("commands.stream"), self._path, params={"since": since or None}), collector
        )

    @uses("commands.stdin")
    async def send_stdin(self, data: str, *, eof: bool = False) -> None:
        """Writes `data` to its stdin (`eof=True` closes stdin afterwards)."""
        await self.sandbox._transport.request(op("commands.stdin"), self._path, json={"data": data, "eof": eof})

    async def close_stdin(self) -> None:
        await self.send_stdin("", eof=True)

    @uses("commands.resize")
    async def resize(self, cols: int, rows: int) -> None:
        """Gives its pseudo-terminal (it was started with `pty`) a new size; its foreground processes get SIGWINCH."""
        await self.sandbox._transport.request(op("commands.resize"), self._path, json={"cols": cols, "rows": rows})

    @uses("commands.signal")
    async def signal(self, signal: Union[int, str]) -> None:
        """Sends a signal (a number or a name such as "SIGTERM") to its process group."""
        await self.sandbox._transport.request(op("commands.signal"), self._path, json={"signal": signal})

    @uses("commands.kill")
    async def kill(self) -> None:
        """SIGKILL to its process group (it stays listed with its exit)."""
        await self.sandbox._transport.request(op("commands.kill"), self._path)

    def __repr__(self) -> str:
        return f"AsyncCommandHandle({self.id!r}, pid={self.pid})"


class AsyncCommands:
    """A sandbox's background commands."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    @uses("commands.list")
    async def list(self) -> List[CommandInfo]:
        """Running and recently ended background commands, oldest first."""
        response = await self._sandbox._transport.request(op("commands.list"), {"id": self._sandbox.id})
        return [CommandInfo.from_json(item) for item in json_of(response).get("commands", [])]

    def handle(self, command_id: str) -> AsyncCommandHandle:
        """A handle on a background command known by id (e.g. from `list()`)."""
        return AsyncCommandHandle(self._sandbox, command_id, None, None)


class AsyncContexts:
    """A sandbox's stateful code contexts (interpreters whose variables persist between cells)."""

    def __init__(self, transport: AsyncTransport, sandbox_id: str) -> None:
        self._transport = transport
        self._path = {"id": sandbox_id}

    @uses("contexts.create")
    async def create(self, language: str = "python") -> ContextInfo:
        response = await self._transport.request(
            op("contexts.create"), self._path, json={"language": language}, long=True
        )
        return ContextInfo.from_json(json_of(response))

    @uses("contexts.list")
    async def list(self) -> List[ContextInfo]:
        response = await self._transport.request(op("contexts.list"), self._path)
        return [ContextInfo.from_json(item) for item in json_of(response).get("contexts", [])]

    @uses("contexts.delete")
    async def delete(self, context: Union[str, ContextInfo]) -> None:
        await self._transport.request(op("contexts.delete"), {**self._path, "context_id": _context_id(context)})

    @uses("contexts.restart")
    async def restart(self, context: Union[str, ContextInfo]) -> ContextInfo:
        """Restarts the context's interpreter (its variables are lost)."""
        path = {**self._path, "context_id": _context_id(context)}
        return ContextInfo.from_json(json_of(await self._transport.request(op("contexts.restart"), path, long=True)))


def _context_id(context: Union[str, ContextInfo]) -> str:
    if isinstance(context, ContextInfo):
        return context.id
    if not isinstance(context, str):
        raise TypeError(f"a context is a ContextInfo or its id, not {context!r}")
    return context


class Creating:
    """What `AsyncSandbox.create` returns: await it for the sandbox, or `async with` it to kill the sandbox on exit."""

    def __init__(self, creating: Awaitable[AsyncSandbox]) -> None:
        self._creating = creating
        self._sandbox: Optional[AsyncSandbox] = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._creating.__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._sandbox = await self._creating
        return self._sandbox

    async def __aexit__(
        self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        if self._sandbox is not None:
            await self._sandbox.__aexit__(kind, value, tb)
