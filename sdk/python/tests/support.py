"""Helpers of the SDK suite: the run id every sandbox is labelled with, the record of created ids, and creation."""

from __future__ import annotations

import os
import uuid
from typing import Any, List

from sandkasten import Sandbox

#: Labels this run's sandboxes (`metadata.suite`), so the cleanup finds any the record missed.
RUN_ID = uuid.uuid4().hex[:12]
#: Every sandbox id the suite created (killed and reported at the end of the session).
CREATED: List[str] = []
#: Another tenant's key, for the isolation tests.
OTHER_KEY = os.environ.get("SANDKASTEN_SUITE_OTHER_API_KEY", "")
#: An admin tenant's key (reads the server's config), and the keys whose values must never appear in it.
ADMIN_KEY = os.environ.get("SANDKASTEN_SUITE_ADMIN_API_KEY", "")
#: The tier the server's sandboxes should be of (the Rust driver runs the suite once per tier), if known.
TIER = os.environ.get("SANDKASTEN_SUITE_TIER")
#: Limits for a sandbox whose code is heavy for an emulated CPU (a microVM under software emulation runs code an order
#: of magnitude slower: importing matplotlib takes ~25 s there, past the default 10 s command limit).
HEAVY_CODE_LIMITS = {"timeout_ms": 120_000} if TIER == "microvm" else None


def labels(**extra: str) -> dict:
    return {"suite": RUN_ID, **extra}


def record(sandbox_id: str) -> str:
    CREATED.append(sandbox_id)
    return sandbox_id


def create(**options: Any) -> Sandbox:
    """Sandbox.create with this run's label; the id is recorded before the caller can fail."""
    options.setdefault("metadata", labels())
    sandbox = Sandbox.create(**options)
    record(sandbox.id)
    assert TIER is None or sandbox.isolation.tier == TIER, f"{sandbox.id} is on {sandbox.isolation.tier}, not {TIER}"
    return sandbox
