"""The sync `Client`: what is not one sandbox's — creating and listing sandboxes, the one-shot `run`, the tenant's
snapshots, secrets and warm pools. A Sandbox made through a Client shares its connections. `AsyncClient` in
aio_client.py is the same over asyncio."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Type, Union

from . import _bodies
from ._http import DEFAULT_TIMEOUT, Transport, json_of
from ._operations import op, uses
from ._streams import OutputCallback, RunCollector, TemplateBuildCollector, drain
from .models import (
    LimitsLike,
    NetworkLike,
    PoolInfo,
    SandboxInfo,
    ScanReport,
    SecretInfo,
    ServerConfigInfo,
    SnapshotInfo,
    TemplateBuild,
    TemplateInfo,
)
from .results import RunResult, stream_bytes
from .sandbox import Sandbox


class Client:
    """A connection to one server with one tenant key (url and key default to SANDKASTEN_URL, SANDKASTEN_API_KEY;
    `request_timeout` bounds connecting and every call that does not wait on a program, in seconds)."""

    def __init__(
        self, url: Optional[str] = None, api_key: Optional[str] = None, *, request_timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self._transport = Transport(url, api_key, request_timeout)
        self.snapshots = Snapshots(self._transport)
        self.secrets = Secrets(self._transport)
        self.pools = Pools(self._transport)
        self.templates = Templates(self._transport)

    @uses("sandboxes.create")
    def create_sandbox(
        self,
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
    ) -> Sandbox:
        """Creates a sandbox with `Sandbox.create`'s options (`snapshot`: an `sn-…` id to start on); it shares this
        client's connections, so closing the client closes them."""
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
        return Sandbox._created(self._transport, body, owns_transport=False)

    @uses("sandboxes.get")
    def connect(self, sandbox_id: str) -> Sandbox:
        response = self._transport.request(op("sandboxes.get"), {"id": sandbox_id})
        return Sandbox(SandboxInfo.from_json(json_of(response)), self._transport)

    @uses("sandboxes.list")
    def list_sandboxes(
        self,
        *,
        state: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        page_size: Optional[int] = None,
    ) -> List[SandboxInfo]:
        """The tenant's sandboxes, oldest first; `state` and `metadata` filter them. With `page_size` (1 to 1000)
        they are fetched that many per request, each page following the last one's cursor (`next_cursor`), so a long
        list neither arrives in one answer nor repeats or skips sandboxes that start or end meanwhile."""
        params: Dict[str, Any] = {"state": state, "limit": page_size}
        params.update({f"metadata.{key}": value for key, value in (metadata or {}).items()})
        listed: List[SandboxInfo] = []
        while True:
            answer = json_of(self._transport.request(op("sandboxes.list"), {}, params=params))
            listed.extend(SandboxInfo.from_json(item) for item in answer.get("sandboxes", []))
            cursor = answer.get("next_cursor")
            if page_size is None or not cursor:
                return listed
            params["cursor"] = cursor

    @uses("config")
    def config(self) -> ServerConfigInfo:
        """The config the server applies, every default filled in and secrets redacted (admin tenants only: others
        raise Forbidden)."""
        response = self._transport.request(op("config"), {})
        return ServerConfigInfo.from_json(json_of(response))

    @uses("scan")
    def scan(self, code: str, language: str, *, policy: Optional[Mapping[str, Any]] = None) -> ScanReport:
        """The static scan of `code` (python, javascript or bash) without running it: the findings and the verdict a
        run would get under the tenant's scan policy, tightened by `policy` (a loosening one raises Unprocessable)."""
        body: Dict[str, Any] = {"language": language, "code": code}
        if policy is not None:
            body["policy"] = dict(policy)
        response = self._transport.request(op("scan"), {}, json=body)
        return ScanReport.from_json(json_of(response))

    @uses("run")
    def run(
        self,
        code: Optional[str] = None,
        language: Optional[str] = None,
        *,
        command: Optional[_bodies.Command] = None,
        files: Optional[Mapping[str, Union[str, bytes]]] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Optional[str] = None,
        isolation: Optional[str] = None,
        limits: Optional[LimitsLike] = None,
        network: Optional[NetworkLike] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> RunResult:
        """Runs code (`language`: python, node, bash or c) or a command once in a fresh sandbox that is destroyed
        afterwards. `error_code` is `compile_error` when C did not compile."""
        body = _bodies.run_body(
            code=code,
            language=language,
            command=command,
            files=files,
            env=env,
            stdin=stdin,
            isolation=isolation,
            limits=limits,
            network=network,
        )
        if on_stdout is None and on_stderr is None:
            response = json_of(self._transport.request(op("run"), {}, json=body, long=True))
            return RunResult.from_run(response, *_inline_output(response))
        collector = RunCollector(on_stdout, on_stderr)
        return drain(self._transport.stream(op("run"), {}, json=body), collector)

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.close()


def _inline_output(body: Any) -> "tuple[bytes, bytes]":
    return stream_bytes(body, "stdout"), stream_bytes(body, "stderr")


class Snapshots:
    """The tenant's snapshots (take one with `Sandbox.snapshot`, start on one with `snapshot=` at create)."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    @uses("snapshots.list")
    def list(self) -> List[SnapshotInfo]:
        response = self._transport.request(op("snapshots.list"), {})
        return [SnapshotInfo.from_json(item) for item in json_of(response).get("snapshots", [])]

    @uses("snapshots.get")
    def get(self, snapshot_id: str) -> SnapshotInfo:
        return SnapshotInfo.from_json(json_of(self._transport.request(op("snapshots.get"), {"id": snapshot_id})))

    @uses("snapshots.delete")
    def delete(self, snapshot_id: str) -> None:
        self._transport.request(op("snapshots.delete"), {"id": snapshot_id}, long=True)


class Secrets:
    """The tenant's secrets: values stay on the server and are put into requests toward their hosts only."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    @uses("secrets.list")
    def list(self) -> List[SecretInfo]:
        response = self._transport.request(op("secrets.list"), {})
        return [SecretInfo.from_json(item) for item in json_of(response).get("secrets", [])]

    @uses("secrets.get")
    def get(self, name: str) -> SecretInfo:
        """One secret by name or id (`sec_…`); never its value."""
        return SecretInfo.from_json(json_of(self._transport.request(op("secrets.get"), {"name": name})))

    @uses("secrets.put")
    def put(self, name: str, value: str, hosts: Sequence[str]) -> SecretInfo:
        body = {"value": value, "hosts": list(hosts)}
        return SecretInfo.from_json(json_of(self._transport.request(op("secrets.put"), {"name": name}, json=body)))

    @uses("secrets.delete")
    def delete(self, name: str) -> None:
        self._transport.request(op("secrets.delete"), {"name": name})


class Pools:
    """The server's warm pools (resizing needs an admin tenant)."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    @uses("pools.list")
    def list(self) -> List[PoolInfo]:
        response = self._transport.request(op("pools.list"), {})
        return [PoolInfo.from_json(item) for item in json_of(response).get("pools", [])]

    @uses("pools.resize")
    def resize(self, name: str, *, min: int, max: int) -> PoolInfo:
        body = {"min": min, "max": max}
        return PoolInfo.from_json(json_of(self._transport.request(op("pools.resize"), {"name": name}, json=body)))


class Templates:
    """The templates built on the server (`sandkasten template build --cache`); removing one needs an admin tenant."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    @uses("templates.list")
    def list(self) -> List[TemplateInfo]:
        response = self._transport.request(op("templates.list"), {})
        return [TemplateInfo.from_json(item) for item in json_of(response).get("templates", [])]

    @uses("templates.build")
    def build(
        self,
        spec: Union[str, Mapping[str, Any], None] = None,
        *,
        dockerfile: Optional[str] = None,
        name: Optional[str] = None,
        files: Optional[Mapping[str, Union[str, bytes]]] = None,
        on_output: Optional[OutputCallback] = None,
        on_event: Optional[Callable[[Any], Any]] = None,
    ) -> TemplateBuild:
        """Builds a template on the server (admin tenants only): `spec` is a template.toml text or its fields as a
        dict, or give a `dockerfile` (and `name`); `files` are what its `[[files]]` (or `COPY`) name, by `src`. Each
        step's output goes to `on_output`, every event (`step`, `output`, `download`, `layer`, `ready`, `done`) to
        `on_event`. Returns the template's digest and layers; a failing step or `ready` raises `TemplateBuildFailed` with its
        output, a bad spec `Unprocessable` naming the field."""
        body = _bodies.template_build_body(spec, dockerfile, name, files)
        collector = TemplateBuildCollector(on_output, on_event)
        return drain(self._transport.stream(op("templates.build"), {}, json=body), collector)

    @uses("templates.delete")
    def delete(self, name: str) -> None:
        """Removes the template; its running sandboxes keep their layers until they end."""
        self._transport.request(op("templates.delete"), {"name": name})
