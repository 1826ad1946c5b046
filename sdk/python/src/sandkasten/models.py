"""What the API answers, as typed, read-only dataclasses (field names are the API's; docs/api/openapi.json documents
each): sandboxes, snapshots, files, code contexts, network policy and egress events, secrets, pools. Each is built
with `from_json` from the response body; `raw` keeps the whole object, so fields a newer server adds are not lost.
Results of running something (commands, cells, one-shot runs) are in `results.py`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

Json = Dict[str, Any]


def _drop_none(values: Json) -> Json:
    return {key: value for key, value in values.items() if value is not None}


def _fields(cls: Any, body: Json, *, skip: Tuple[str, ...] = ()) -> Json:
    """The values of the dataclass `cls`'s fields from `body` (None where it has none)."""
    return {key: body.get(key) for key in cls.__dataclass_fields__ if key not in skip}


@dataclass(frozen=True)
class Limits:
    """Hard limits of a sandbox; a field left None takes the server's default (documented on `LimitsBody`)."""

    cpus: Optional[float] = None  #: CPU bandwidth in CPUs (default 1.0)
    memory_bytes: Optional[int] = None  #: memory, swap 0 (default 256 MiB)
    disk_bytes: Optional[int] = None  #: each writable filesystem and the largest file (default 128 MiB)
    pids: Optional[int] = None  #: processes and threads at once (default 128)
    output_bytes: Optional[int] = None  #: bytes kept per output stream (default 1 MiB)
    timeout_ms: Optional[int] = None  #: wall-clock time of one command, milliseconds (default 10 000)

    def to_json(self) -> Json:
        return _drop_none(asdict(self))

    @classmethod
    def from_json(cls, body: Json) -> Limits:
        return cls(**_fields(cls, body))


@dataclass(frozen=True)
class HeaderRule:
    """A header the egress proxy sets on requests to `host`; `${secrets.NAME}` in `value` is that secret's value."""

    host: str
    name: str
    value: str

    def to_json(self) -> Json:
        return {"host": self.host, "name": self.name, "value": self.value}

    @classmethod
    def from_json(cls, body: Json) -> HeaderRule:
        return cls(host=body["host"], name=body["name"], value=body["value"])


@dataclass(frozen=True)
class NetworkPolicy:
    """Network access: `none` (the default), `allowlist` (the `allow` host patterns, minus `deny`) or `open`;
    `headers` are header rules the proxy applies (over intercepted TLS only)."""

    mode: str = "none"
    allow: List[str] = field(default_factory=list)
    deny: List[str] = field(default_factory=list)
    headers: List[HeaderRule] = field(default_factory=list)

    def to_json(self) -> Json:
        body: Json = {"mode": self.mode, "allow": list(self.allow), "deny": list(self.deny)}
        if self.headers:
            body["headers"] = [rule.to_json() for rule in self.headers]
        return body

    @classmethod
    def from_json(cls, body: Json) -> NetworkPolicy:
        return cls(
            mode=body.get("mode", "none"),
            allow=list(body.get("allow", [])),
            deny=list(body.get("deny", [])),
            headers=[HeaderRule.from_json(rule) for rule in body.get("headers", [])],
        )

    @classmethod
    def allowlist(cls, *hosts: str, deny: Optional[List[str]] = None) -> NetworkPolicy:
        """Only these host patterns (`api.example.com`, `*.example.org:443`)."""
        return cls(mode="allowlist", allow=list(hosts), deny=list(deny or []))


#: What the SDK accepts for a policy: a NetworkPolicy, its JSON form, or a mode name (`"none"`, `"open"`).
NetworkLike = Union[NetworkPolicy, Json, str]
#: What the SDK accepts for limits: Limits or its JSON form.
LimitsLike = Union[Limits, Json]


def network_json(policy: NetworkLike) -> Json:
    if isinstance(policy, NetworkPolicy):
        return policy.to_json()
    if isinstance(policy, str):
        return {"mode": policy}
    return dict(policy)


def limits_json(limits: LimitsLike) -> Json:
    return limits.to_json() if isinstance(limits, Limits) else dict(limits)


@dataclass(frozen=True)
class Isolation:
    """The tier a sandbox runs on and why (`Isolation`): `reason` is `requested`, `server default` or the `auto` rule
    that chose it; `accel` is `kvm` or `tcg` (software emulation) on the microvm tier, else None."""

    tier: str
    reason: str
    accel: Optional[str]

    @classmethod
    def from_json(cls, body: Any) -> Isolation:
        if isinstance(body, str):  # a snapshot's source tier, or an older server's answer
            return cls(tier=body, reason="", accel=None)
        body = body or {}
        return cls(tier=body.get("tier", ""), reason=body.get("reason", ""), accel=body.get("accel"))


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the server describes it (`SandboxBody`)."""

    id: str
    tenant: str
    state: str  #: running, paused, destroyed, expired or lost
    pause_mode: Optional[str]  #: while paused: memory or filesystem
    isolation: Isolation
    template: str
    limits: Limits
    network: NetworkPolicy
    metadata: Dict[str, str]
    env_names: List[str]
    secrets: List[str]
    created_at: str
    expires_at: str
    ended_at: Optional[str]
    end_reason: Optional[str]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, body: Json) -> SandboxInfo:
        return cls(
            id=body["id"],
            tenant=body.get("tenant", ""),
            state=body.get("state", ""),
            pause_mode=body.get("pause_mode"),
            isolation=Isolation.from_json(body.get("isolation")),
            template=body.get("template", ""),
            limits=Limits.from_json(body.get("limits") or {}),
            network=NetworkPolicy.from_json(body.get("network") or {}),
            metadata=dict(body.get("metadata") or {}),
            env_names=list(body.get("env_names") or []),
            secrets=list(body.get("secrets") or []),
            created_at=body.get("created_at", ""),
            expires_at=body.get("expires_at", ""),
            ended_at=body.get("ended_at"),
            end_reason=body.get("end_reason"),
            raw=body,
        )


@dataclass(frozen=True)
class Finding:
    """One finding of the static scan (`Finding`)."""

    rule: str  #: stable rule id, e.g. process_exec
    severity: str  #: info, low, medium, high or critical
    line: int  #: from 1
    column: int  #: from 1, in characters
    message: str  #: what was found and what to do instead

    @classmethod
    def from_json(cls, body: Json) -> Finding:
        return cls(
            rule=body.get("rule", ""),
            severity=body.get("severity", ""),
            line=int(body.get("line", 0)),
            column=int(body.get("column", 0)),
            message=body.get("message", ""),
        )


@dataclass(frozen=True)
class ScanReport:
    """What the static scan found and the verdict a run would get (`ScanReport`)."""

    findings: List[Finding]
    verdict: str  #: allow, warn or block

    @classmethod
    def from_json(cls, body: Json) -> ScanReport:
        findings = [Finding.from_json(finding) for finding in body.get("findings") or []]
        return cls(findings=findings, verdict=body.get("verdict", ""))


@dataclass(frozen=True)
class Transfer:
    """A save or restore of a snapshot in progress (`TransferProgress`)."""

    direction: str  #: saving or restoring
    bytes_done: int
    bytes_total: Optional[int]  #: None while unknown

    @classmethod
    def from_json(cls, body: Json) -> Transfer:
        total = body.get("bytes_total")
        return cls(
            direction=body.get("direction", ""),
            bytes_done=int(body.get("bytes_done", 0)),
            bytes_total=None if total is None else int(total),
        )


@dataclass(frozen=True)
class UsageSample:
    """One sample of what a sandbox used (`UsageSample`)."""

    timestamp_ms: int
    cpu_used_pct: float  #: share of the sandbox's `limits.cpus` since the sample before
    memory_used_bytes: int  #: held besides file cache
    memory_cache_bytes: int
    disk_used_bytes: int  #: home, /tmp and /dev/shm together
    disk_total_bytes: int

    @classmethod
    def from_json(cls, body: Json) -> UsageSample:
        return cls(
            timestamp_ms=int(body.get("timestamp_ms", 0)),
            cpu_used_pct=float(body.get("cpu_used_pct", 0.0)),
            memory_used_bytes=int(body.get("memory_used_bytes", 0)),
            memory_cache_bytes=int(body.get("memory_cache_bytes", 0)),
            disk_used_bytes=int(body.get("disk_used_bytes", 0)),
            disk_total_bytes=int(body.get("disk_total_bytes", 0)),
        )


@dataclass(frozen=True)
class SandboxMetrics:
    """A sandbox's usage samples, oldest first, with its CPU and memory limits (`SandboxMetrics`)."""

    sandbox_id: str
    cpus: float
    memory_limit_bytes: int
    samples: List[UsageSample]

    @classmethod
    def from_json(cls, body: Json) -> SandboxMetrics:
        return cls(
            sandbox_id=body.get("sandbox_id", ""),
            cpus=float(body.get("cpus", 0.0)),
            memory_limit_bytes=int(body.get("memory_limit_bytes", 0)),
            samples=[UsageSample.from_json(sample) for sample in body.get("samples") or []],
        )


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot (`SnapshotBody`): a sandbox's files, and with `memory` its processes too."""

    id: str
    sandbox_id: str
    name: Optional[str]
    isolation: str
    template: str
    memory: bool
    state: str  #: saving or ready
    size_bytes: int
    stored_bytes: int
    dirs: List[str]
    created_at: str
    transfers: List[Transfer]  #: its save while saving, and restores from it in progress
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, body: Json) -> SnapshotInfo:
        return cls(
            id=body["snapshot_id"],
            sandbox_id=body.get("sandbox_id", ""),
            name=body.get("name"),
            isolation=body.get("isolation", ""),
            template=body.get("template", ""),
            memory=bool(body.get("memory", False)),
            state=body.get("state", ""),
            size_bytes=int(body.get("size_bytes", 0)),
            stored_bytes=int(body.get("stored_bytes", 0)),
            dirs=list(body.get("dirs") or []),
            created_at=body.get("created_at", ""),
            transfers=[Transfer.from_json(transfer) for transfer in body.get("transfers") or []],
            raw=body,
        )


@dataclass(frozen=True)
class FileInfo:
    """A path inside a sandbox (`FileInfoBody`)."""

    name: str
    path: str
    kind: str  #: file, dir, symlink or other
    size: int
    mode: int
    modified_unix_ms: int
    uid: int
    gid: int
    symlink_target: Optional[str]

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @classmethod
    def from_json(cls, body: Json) -> FileInfo:
        return cls(**_fields(cls, body))


@dataclass(frozen=True)
class ArchiveSummary:
    """What an upload of a directory wrote."""

    files: int
    directories: int
    bytes: int

    @classmethod
    def from_json(cls, body: Json) -> ArchiveSummary:
        return cls(files=body["files"], directories=body["directories"], bytes=body["bytes"])


@dataclass(frozen=True)
class ContextInfo:
    """A stateful code context (`ContextBody`): an interpreter whose variables persist between cells."""

    id: str
    language: str
    default: bool
    execution_count: int

    @classmethod
    def from_json(cls, body: Json) -> ContextInfo:
        return cls(**_fields(cls, body))


@dataclass(frozen=True)
class EgressEvent:
    """One connection attempt through the sandbox's egress proxy, with the decision and the rule that made it."""

    time_ms: int
    scheme: str
    host: str
    port: int
    decision: str  #: allowed or refused
    rule: str
    bytes_up: int
    bytes_down: int
    resolved: Optional[str] = None
    connection: Optional[int] = None
    open: bool = False

    @classmethod
    def from_json(cls, body: Json) -> EgressEvent:
        return cls(**{key: body[key] for key in cls.__dataclass_fields__ if key in body})


@dataclass(frozen=True)
class SecretInfo:
    """A tenant secret's id, name, hosts, metadata and version (values never come back)."""

    name: str
    hosts: List[str]
    updated_at: str
    id: str = ""
    metadata: Dict[str, str] = field(default_factory=dict)
    version: int = 1
    created_at: str = ""

    @classmethod
    def from_json(cls, body: Json) -> SecretInfo:
        return cls(
            name=body["name"],
            hosts=list(body.get("hosts") or []),
            updated_at=body.get("updated_at", ""),
            id=body.get("id", ""),
            metadata=dict(body.get("metadata") or {}),
            version=int(body.get("version", 1)),
            created_at=body.get("created_at", ""),
        )


@dataclass(frozen=True)
class TierStatus:
    """Whether one isolation tier runs on the server's host (`TierStatus`)."""

    tier: str
    available: bool
    reason: Optional[str]  #: why not, when it is not available


@dataclass(frozen=True)
class ServerConfigInfo:
    """The config the server applies (`ConfigBody`, admin tenants only): `config` has the config file's keys and shape
    (docs/config.schema.json) with every default filled in; API keys and S3 credentials read "<redacted>"."""

    config: Json
    default_limits: Limits
    tiers: List[TierStatus]

    @classmethod
    def from_json(cls, body: Json) -> ServerConfigInfo:
        return cls(
            config=body.get("config") or {},
            default_limits=Limits.from_json(body.get("default_limits") or {}),
            tiers=[TierStatus(**_fields(TierStatus, tier)) for tier in body.get("tiers") or []],
        )


@dataclass(frozen=True)
class TemplateBuild:
    """A finished template build (its `done` event): the template's name, digest and layers, and the build's
    `step` events in order (each says whether its layer came from the cache)."""

    name: str
    digest: str
    layers: List[str]
    size_bytes: int
    steps: List[Json]

    @property
    def cached(self) -> bool:
        """Whether every step's layer came from the cache."""
        return all(step.get("cached") for step in self.steps)


@dataclass(frozen=True)
class TemplateInfo:
    """A template built on the server (`TemplateBody`): what `create_sandbox(template=...)` may name."""

    name: str
    digest: str
    base: str
    layers: int
    size_bytes: int
    created: int
    workdir: Optional[str]
    user: str
    preload: List[str]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, body: Json) -> TemplateInfo:
        return cls(**_fields(cls, body, skip=("raw",)), raw=body)


@dataclass(frozen=True)
class PoolInfo:
    """A warm pool (`PoolBody`)."""

    name: str
    isolation: str
    template: str
    min: int
    max: int
    target: int
    ready: int
    creating: int
    hits: int
    misses: int
    zygote: Optional[str]
    raw: Json = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, body: Json) -> PoolInfo:
        return cls(**_fields(cls, body, skip=("raw",)), raw=body)
