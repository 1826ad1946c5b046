"""Shared helpers of the E2B compatibility suite: sandboxes created here are tagged with this run's id and recorded,
so that conftest.py kills every one of them at the end of the session, whatever failed."""

import inspect
import os
import re
import time
import uuid

import e2b

# Tags every sandbox of this pytest run (metadata "suite"), so the session's cleanup can find them by listing too.
RUN_ID = uuid.uuid4().hex[:12]

# Ids of every sandbox the suite created, killed at the session's end.
CREATED: list[str] = []

# What the SDK raises when a per-sandbox call finds the sandbox gone (killed or expired): `SandboxNotRunningException`
# where the SDK has it (newer releases), `TimeoutException` in the releases before it (for the same server answer).
try:
    from e2b import SandboxNotRunningException as SandboxGoneException
except ImportError:  # an older SDK (the compatibility matrix runs several)
    from e2b import TimeoutException as SandboxGoneException

# What older SDK releases (tests/e2b/compat-versions.txt) do differently, detected from the SDK itself, never from its
# version number. Each is either an API the release lacks (its tests skip) or a request it makes differently (a strict
# xfail naming it, see `sdk_differs`), so the compatibility matrix says what a program on that release will see.

# `pause(mode="filesystem")`, or before `mode` existed `pause(keep_memory=False)`: the same request (`memory: false`).
FILESYSTEM_PAUSE = {"mode": "filesystem"} if "mode" in inspect.signature(e2b.Sandbox.pause).parameters else {
    "keep_memory": False
}
# `create_snapshot(mode=…)`: without it the SDK takes full snapshots only (memory too, which needs gVisor).
SNAPSHOT_MODES = "mode" in inspect.signature(e2b.Sandbox.create_snapshot).parameters
# `Sandbox.list(order=…)` and `SandboxQuery(started_after=…)`, which older releases lack.
LIST_ORDER = "order" in inspect.signature(e2b.Sandbox.list).parameters
QUERY_STARTED_AFTER = "started_after" in inspect.signature(e2b.SandboxQuery).parameters
NEWER_LISTING = LIST_ORDER and QUERY_STARTED_AFTER


def _watches_with_entries() -> bool:
    from e2b.envd.filesystem import filesystem_pb

    return hasattr(filesystem_pb.WatchDirRequest(), "include_entry")


# `files.watch_dir(include_entry=True)` (envd 0.6.3: each event carries its entry's info), which older releases lack.
WATCH_ENTRY = _watches_with_entries()


def needs_watch_entry():
    import pytest

    return pytest.mark.skipif(not WATCH_ENTRY, reason="no watch_dir(include_entry) in this SDK")


def needs_newer_listing():
    import pytest

    return pytest.mark.skipif(not NEWER_LISTING, reason="no list(order) or SandboxQuery(started_after) in this SDK")


# Releases whose `create` defaults to `allow_internet_access=True` (E2B's default) ask for the internet unless told not
# to; later ones send nothing, which sandkasten takes as no network.
ASKS_FOR_INTERNET = inspect.signature(e2b.Sandbox.create).parameters["allow_internet_access"].default is True


def _sends_public_traffic() -> bool:
    from e2b.api.client.models import SandboxNetworkConfig

    return SandboxNetworkConfig().allow_public_traffic is True


# Releases whose generated `SandboxNetworkConfig` defaults `allowPublicTraffic` to true send it with every `network`.
PUBLIC_WITH_NETWORK = _sends_public_traffic()


def _reads_is_symlink() -> bool:
    from e2b.envd.filesystem import filesystem_pb

    return hasattr(filesystem_pb.EntryInfo(), "is_symlink")


# Newer envd (and the facade) report a symlink's target type in `type` and mark the link with `is_symlink`; releases
# that predate the field report such a link as its target's type.
READS_IS_SYMLINK = _reads_is_symlink()


def _probes_unexplained_unavailable() -> bool:
    from e2b.envd import rpc

    return hasattr(rpc, "is_ambiguous_unavailable")


# Newer releases probe the sandbox when a stream ends with an `unavailable` they cannot explain and then raise "killed
# or reached its end of life"; older ones probe only when the connection itself breaks (a reset: HTTP/2's RST_STREAM
# through E2B's proxy), and otherwise raise their "likely due to sandbox timeout" `TimeoutException`.
PROBES_UNAVAILABLE = _probes_unexplained_unavailable()


def sdk_differs(condition: bool, why: str):
    """A strict xfail where this SDK release sends or reads something differently than the suite expects of the
    newest one (`why` says what, and becomes the cell of docs/e2b-compat.md's matrix): an assertion must fail."""
    import pytest

    return pytest.mark.xfail(condition, strict=True, raises=AssertionError, reason=f"older SDK: {why}")


def status_of(error) -> int | None:
    """The HTTP status of an SDK exception: `status_code` where the SDK has it, else the `NNN: ` older releases put
    at the front of the message."""
    status = getattr(error, "status_code", None)
    if status is None:
        match = re.match(r"(\d{3}): ", str(error))
        status = int(match.group(1)) if match else None
    return status


# Where the server is: set by crates/cli/tests/e2b_sdk.rs (or by hand, for a server you started yourself).
REQUIRED_ENV = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")


def not_yet(feature: str):
    """Marks a test of an SDK feature the facade does not have yet: `feature` is its row in docs/e2b-compat.md's table.

    Strict: once the feature works the test passes, the mark fails the run, and the docs' table must change with it.
    (Reasons read `WHAT: WHY`; the compatibility matrix shows the WHY.)
    Only an SDK exception counts as the expected failure, so a broken test cannot hide behind the mark.
    """
    import pytest
    from e2b import SandboxException

    # Only the SDK's refusal counts as the expected failure: an assertion error means the feature half works.
    return pytest.mark.xfail(
        strict=True,
        raises=SandboxException,
        reason=f"{feature}: not supported by sandkasten's E2B facade yet (docs/e2b-compat.md)",
    )


def native_network_policy(sandbox_id):
    """The sandbox's network policy as sandkasten's own API shows it (the E2B key is a sandkasten tenant key)."""
    import json
    import urllib.request

    request = urllib.request.Request(
        f"{os.environ['E2B_API_URL']}/v1/sandboxes/{sandbox_id}",
        headers={"Authorization": f"Bearer {os.environ['E2B_API_KEY']}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["network"]


def missing_env() -> list[str]:
    return [name for name in REQUIRED_ENV if not os.environ.get(name)]


def tagged(metadata: dict | None) -> dict:
    return {"suite": RUN_ID, **(metadata or {})}


def create(cls, **kwargs):
    """`cls.create(**kwargs)` (a sync Sandbox class), tagged and recorded for the final cleanup."""
    kwargs["metadata"] = tagged(kwargs.get("metadata"))
    sandbox = cls.create(**kwargs)
    CREATED.append(sandbox.sandbox_id)
    return sandbox


async def acreate(cls, **kwargs):
    """`await cls.create(**kwargs)` (an AsyncSandbox class), tagged and recorded for the final cleanup."""
    kwargs["metadata"] = tagged(kwargs.get("metadata"))
    sandbox = await cls.create(**kwargs)
    CREATED.append(sandbox.sandbox_id)
    return sandbox


def wait_until(predicate, what: str, limit: float = 10.0):
    """Polls `predicate` until it is true; fails naming `what` after `limit` seconds (a bound, not a measurement)."""
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
