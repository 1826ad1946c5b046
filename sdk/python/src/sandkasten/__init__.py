"""sandkasten: a typed Python client for the native API (`/v1/...`) of a sandkasten server, sync (`Sandbox`, `Client`)
and async (`AsyncSandbox`, `AsyncClient`). The server's URL and tenant key come from arguments or from SANDKASTEN_URL
and SANDKASTEN_API_KEY.

    from sandkasten import Sandbox

    with Sandbox.create(isolation="process") as sbx:
        print(sbx.exec("echo hi").stdout)
"""

from ._http import __version__
from .aio_client import AsyncClient, AsyncPools, AsyncSecrets, AsyncSnapshots
from .aio_files import AsyncFiles
from .aio_sandbox import AsyncCommandHandle, AsyncCommands, AsyncContexts, AsyncSandbox, Creating
from .client import Client, Pools, Secrets, Snapshots
from .errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InternalError,
    MethodNotAllowed,
    NotFound,
    Paused,
    PayloadTooLarge,
    ProtocolError,
    QuotaExceeded,
    SandkastenError,
    StoreFailed,
    TierFailed,
    TierUnavailable,
    Unauthorized,
    Unprocessable,
)
from .files import Files
from .models import (
    ArchiveSummary,
    ContextInfo,
    EgressEvent,
    FileInfo,
    Finding,
    HeaderRule,
    Limits,
    NetworkPolicy,
    Isolation,
    PoolInfo,
    SandboxInfo,
    SandboxMetrics,
    ScanReport,
    SecretInfo,
    ServerConfigInfo,
    SnapshotInfo,
    TierStatus,
    Transfer,
    UsageSample,
)
from .results import (
    CellError,
    CellResult,
    CodeResult,
    CommandFailed,
    CommandInfo,
    ExecResult,
    PhaseTimings,
    ResourceUsage,
    RunResult,
)
from .sandbox import CommandHandle, Commands, Contexts, Sandbox

__all__ = [
    "__version__",
    "ArchiveSummary",
    "AsyncClient",
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncContexts",
    "AsyncFiles",
    "AsyncPools",
    "AsyncSandbox",
    "AsyncSecrets",
    "AsyncSnapshots",
    "BadRequest",
    "CellError",
    "CellResult",
    "Client",
    "CodeResult",
    "CommandFailed",
    "CommandHandle",
    "CommandInfo",
    "Commands",
    "Conflict",
    "ContextInfo",
    "Contexts",
    "Creating",
    "EgressEvent",
    "ExecResult",
    "FileInfo",
    "Finding",
    "Files",
    "Forbidden",
    "InternalError",
    "HeaderRule",
    "Limits",
    "MethodNotAllowed",
    "NetworkPolicy",
    "NotFound",
    "Paused",
    "PayloadTooLarge",
    "PhaseTimings",
    "PoolInfo",
    "Pools",
    "ProtocolError",
    "QuotaExceeded",
    "ResourceUsage",
    "RunResult",
    "Sandbox",
    "Isolation",
    "SandboxInfo",
    "SandboxMetrics",
    "ScanReport",
    "SandkastenError",
    "SecretInfo",
    "Secrets",
    "ServerConfigInfo",
    "Snapshots",
    "SnapshotInfo",
    "StoreFailed",
    "TierFailed",
    "TierStatus",
    "TierUnavailable",
    "Transfer",
    "Unauthorized",
    "Unprocessable",
    "UsageSample",
]
