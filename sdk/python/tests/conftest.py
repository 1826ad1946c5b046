"""Session set-up of the SDK's suite: the installed `sandkasten` package (never the source tree: the Rust driver
crates/cli/tests/python_sdk.rs builds and installs it first) talks to the server named by SANDKASTEN_URL with the
tenant key SANDKASTEN_API_KEY; SANDKASTEN_SUITE_OTHER_API_KEY is another tenant's key. Every sandbox the suite creates
carries the metadata `suite=<run id>` and is killed when the session ends, even after failures; its ids are appended to
SANDKASTEN_SUITE_IDS_FILE for the driver's host-side leak check. At the end, every operation the SDK declares must have
been called on both the sync and the async surface, or the session fails.

By hand, against a server you started (scripts/setup-python-sdk.sh makes the venv):

    target/python-sdk-venv/bin/pip install --no-deps --no-build-isolation --target /tmp/sk ./sdk/python
    PYTHONPATH=/tmp/sk SANDKASTEN_URL=http://127.0.0.1:8080 SANDKASTEN_API_KEY=<key> \\
    SANDKASTEN_SUITE_OTHER_API_KEY=<another tenant's key> target/python-sdk-venv/bin/python -m pytest sdk/python/tests
"""

from __future__ import annotations

import os
from typing import Iterator, List

import pytest

import support
from sandkasten import Client, Sandbox
from sandkasten._http import CALLED
from sandkasten._operations import OPERATIONS


def pytest_configure(config: pytest.Config) -> None:
    missing = [name for name in ("SANDKASTEN_URL", "SANDKASTEN_API_KEY") if not os.environ.get(name)]
    if missing:
        raise pytest.UsageError(
            f"the SDK suite needs {', '.join(missing)} pointing at a running `sandkasten serve` "
            "(cargo nextest run -p sandkasten-cli --test python_sdk starts one and sets them)"
        )
    import sandkasten

    source_tree = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "src"))
    if os.path.realpath(sandkasten.__file__).startswith(source_tree):
        raise pytest.UsageError("the suite must run against the installed package, not sdk/python/src")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leftovers = set(support.CREATED)
    try:
        with Client() as client:
            leftovers.update(info.id for info in client.list_sandboxes(metadata={"suite": support.RUN_ID}))
            for sandbox_id in sorted(leftovers):
                try:
                    client.connect(sandbox_id).kill()
                except Exception as error:  # gone already, or the server is what broke
                    print(f"sdk suite cleanup: killing {sandbox_id}: {error!r}")
    except Exception as error:
        print(f"sdk suite cleanup: listing this run's sandboxes failed: {error!r}")
    ids_file = os.environ.get("SANDKASTEN_SUITE_IDS_FILE")
    if ids_file:
        with open(ids_file, "a") as out:
            out.writelines(f"{sandbox_id}\n" for sandbox_id in sorted(leftovers))
    # Only a full run can have covered everything (a run of one file by hand is not checked).
    here = os.path.realpath(os.path.dirname(__file__))
    whole = all(os.path.realpath(arg) == here for arg in session.config.args) and not session.config.option.keyword
    if exitstatus == 0 and whole:
        missing: List[str] = [
            f"{surface} {name}"
            for surface in ("sync", "async")
            for name in sorted(OPERATIONS)
            if (surface, name) not in CALLED
        ]
        if missing:
            print(f"\nsdk suite: operations never called: {', '.join(missing)}")
            session.exitstatus = 1


@pytest.fixture(scope="module")
def sbx() -> Iterator[Sandbox]:
    """One Sandbox shared by a module's tests (they must not depend on each other's files or processes)."""
    sandbox = support.create()
    yield sandbox
    sandbox.kill()
    sandbox.close()


@pytest.fixture(scope="session")
def client() -> Iterator[Client]:
    with Client() as client:
        yield client
