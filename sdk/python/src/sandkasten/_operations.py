"""The API operations the SDK calls, as data: each has a name, an HTTP method and the spec's path template. Requests
are only ever made from an `Operation` of this table (the transport formats its path), and every public method names
the operations it uses with `@uses(...)`, so tests/test_drift.py can compare the table and the methods with
docs/api/openapi.json in both directions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple, TypeVar
from urllib.parse import quote


@dataclass(frozen=True)
class Operation:
    """One operation of the API: `method` and `path` exactly as docs/api/openapi.json spells them."""

    name: str
    method: str
    path: str

    def url_path(self, **params: str) -> str:
        """The path with its `{placeholders}` filled in (each value percent-encoded)."""
        path = self.path
        for key, value in params.items():
            path = path.replace("{" + key + "}", quote(str(value), safe=""))
        if "{" in path:
            raise ValueError(f"operation {self.name} needs path parameters: {self.path}")
        return path


def _table(*rows: Tuple[str, str, str]) -> Dict[str, Operation]:
    return {name: Operation(name, method, path) for name, method, path in rows}


SB = "/v1/sandboxes/{id}"

#: Every operation the SDK uses, by name.
OPERATIONS: Dict[str, Operation] = _table(
    ("run", "POST", "/v1/run"),
    ("sandboxes.list", "GET", "/v1/sandboxes"),
    ("sandboxes.create", "POST", "/v1/sandboxes"),
    ("sandboxes.get", "GET", SB),
    ("sandboxes.delete", "DELETE", SB),
    ("sandboxes.set_timeout", "POST", SB + "/timeout"),
    ("sandboxes.pause", "POST", SB + "/pause"),
    ("sandboxes.resume", "POST", SB + "/resume"),
    ("sandboxes.fork", "POST", SB + "/fork"),
    ("sandboxes.snapshot", "POST", SB + "/snapshots"),
    ("sandboxes.metrics", "GET", SB + "/metrics"),
    ("exec", "POST", SB + "/exec"),
    ("commands.list", "GET", SB + "/commands"),
    ("commands.kill", "DELETE", SB + "/commands/{command_id}"),
    ("commands.resize", "POST", SB + "/commands/{command_id}/resize"),
    ("commands.signal", "POST", SB + "/commands/{command_id}/signal"),
    ("commands.stdin", "POST", SB + "/commands/{command_id}/stdin"),
    ("commands.stream", "GET", SB + "/commands/{command_id}/stream"),
    ("code.run", "POST", SB + "/code"),
    ("contexts.list", "GET", SB + "/contexts"),
    ("contexts.create", "POST", SB + "/contexts"),
    ("contexts.delete", "DELETE", SB + "/contexts/{context_id}"),
    ("contexts.restart", "POST", SB + "/contexts/{context_id}/restart"),
    ("files.read", "GET", SB + "/files"),
    ("files.write", "PUT", SB + "/files"),
    ("files.remove", "DELETE", SB + "/files"),
    ("files.download_dir", "GET", SB + "/files/archive"),
    ("files.upload_dir", "PUT", SB + "/files/archive"),
    ("files.list", "GET", SB + "/files/list"),
    ("files.mkdir", "POST", SB + "/files/mkdir"),
    ("files.rename", "POST", SB + "/files/rename"),
    ("files.stat", "GET", SB + "/files/stat"),
    ("network.set", "PUT", SB + "/network"),
    ("network.egress", "GET", SB + "/egress"),
    ("snapshots.list", "GET", "/v1/snapshots"),
    ("snapshots.get", "GET", "/v1/snapshots/{id}"),
    ("snapshots.delete", "DELETE", "/v1/snapshots/{id}"),
    ("secrets.list", "GET", "/v1/secrets"),
    ("secrets.get", "GET", "/v1/secrets/{name}"),
    ("secrets.put", "PUT", "/v1/secrets/{name}"),
    ("secrets.delete", "DELETE", "/v1/secrets/{name}"),
    ("pools.list", "GET", "/v1/pools"),
    ("pools.resize", "PUT", "/v1/pools/{name}"),
    ("templates.list", "GET", "/v1/templates"),
    ("templates.build", "POST", "/v1/templates"),
    ("templates.delete", "DELETE", "/v1/templates/{name}"),
    ("scan", "POST", "/v1/scan"),
    ("config", "GET", "/v1/config"),
)

F = TypeVar("F", bound=Callable[..., Any])


def op(name: str) -> Operation:
    """The operation called `name` (a KeyError names a typo at import time, since call builders run this early)."""
    return OPERATIONS[name]


def uses(*names: str) -> Callable[[F], F]:
    """Marks a public method with the operations it calls (checked against OPERATIONS when the module loads)."""
    for name in names:
        if name not in OPERATIONS:
            raise KeyError(f"@uses names an operation the SDK does not declare: {name}")

    def mark(function: F) -> F:
        function.__sandkasten_operations__ = tuple(names)  # type: ignore[attr-defined]
        return function

    return mark
