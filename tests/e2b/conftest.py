"""Session set-up of the E2B compatibility suite: the unmodified `e2b` and `e2b-code-interpreter` SDKs talk to the
server named by E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY (crates/cli/tests/e2b_sdk.rs starts one and sets them).
Every sandbox the suite creates is killed when the session ends, even after failures.

By hand, against a server you started (scripts/setup-e2b.sh makes the venv):

    E2B_API_URL=http://127.0.0.1:8080 E2B_SANDBOX_URL=http://127.0.0.1:8080 E2B_API_KEY=<tenant key> \
    E2B_SUITE_OTHER_API_KEY=<another tenant's key> target/e2b-venv/bin/python -m pytest tests/e2b -q -rfEsx

Without E2B_SUITE_OTHER_API_KEY the cross-tenant test is skipped (the Rust wrapper sets it and forbids skips)."""

import os

import pytest

import support
from e2b import Sandbox, SandboxQuery


def pytest_configure(config):
    missing = support.missing_env()
    if missing:
        raise pytest.UsageError(
            f"the E2B suite needs {', '.join(missing)} pointing at a running `sandkasten serve` "
            "(cargo nextest run -p sandkasten-cli --test e2b_sdk starts one and sets them)"
        )


@pytest.fixture(scope="session", autouse=True)
def kill_every_created_sandbox():
    yield
    leftovers = set(support.CREATED)
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata={"suite": support.RUN_ID}))
        for _ in range(100):  # bounded: a paginator that never ends must not hang the cleanup
            if not paginator.has_next:
                break
            leftovers.update(info.sandbox_id for info in paginator.next_items())
    except Exception as error:  # the list may be what is broken; the recorded ids are still killed
        print(f"e2b suite cleanup: listing this run's sandboxes failed: {error!r}")
    for sandbox_id in sorted(leftovers):
        try:
            Sandbox.kill(sandbox_id)
        except Exception as error:
            print(f"e2b suite cleanup: killing {sandbox_id} failed: {error!r}")
    # crates/cli/tests/e2b_sdk.rs checks the host for what these sandboxes might have left.
    ids_file = os.environ.get("E2B_SUITE_IDS_FILE")
    if ids_file:
        with open(ids_file, "a") as out:
            out.writelines(f"{sandbox_id}\n" for sandbox_id in sorted(leftovers))


@pytest.fixture(scope="module")
def sbx():
    """One `e2b.Sandbox` shared by a module's tests (they must not depend on each other's files or processes)."""
    sandbox = support.create(Sandbox)
    yield sandbox
    sandbox.kill()
