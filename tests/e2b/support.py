"""Shared helpers of the E2B compatibility suite: sandboxes created here are tagged with this run's id and recorded,
so that conftest.py kills every one of them at the end of the session, whatever failed."""

import os
import time
import uuid

# Tags every sandbox of this pytest run (metadata "suite"), so the session's cleanup can find them by listing too.
RUN_ID = uuid.uuid4().hex[:12]

# Ids of every sandbox the suite created, killed at the session's end.
CREATED: list[str] = []

# Where the server is: set by crates/cli/tests/e2b_sdk.rs (or by hand, for a server you started yourself).
REQUIRED_ENV = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")


def not_yet(feature: str):
    """Marks a test of an SDK feature the facade does not have yet: `feature` is its row in docs/e2b-compat.md's table.

    Strict: once the feature works the test passes, the mark fails the run, and the docs' table must change with it.
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
