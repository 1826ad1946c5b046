"""Session set-up of the E2B compatibility suite: the unmodified `e2b` and `e2b-code-interpreter` SDKs talk to the
server named by E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY (crates/cli/tests/e2b_sdk.rs starts one and sets them).
Every sandbox the suite creates is killed when the session ends, even after failures.

By hand, against a server you started (scripts/setup-e2b.sh makes the venv):

    E2B_API_URL=http://127.0.0.1:8080 E2B_SANDBOX_URL=http://127.0.0.1:8080 E2B_API_KEY=<tenant key> \
    E2B_SUITE_OTHER_API_KEY=<another tenant's key> target/e2b-venv/bin/python -m pytest tests/e2b -q -rfEsx

Without E2B_SUITE_OTHER_API_KEY the cross-tenant test is skipped (the Rust wrapper sets it and forbids skips).

With E2B_SUITE_REPORT set, every test's outcome is appended to that file as JSON lines, after one line naming the SDK
versions: the compatibility matrix (tests/e2b/compat_matrix.py) turns them into docs/e2b-compat.md's table."""

import json
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


def pytest_sessionstart(session):
    report = os.environ.get("E2B_SUITE_REPORT")
    if report:
        from importlib.metadata import version

        with open(report, "w") as out:
            sdk = {name: version(name) for name in ("e2b", "e2b-code-interpreter")}
            out.write(json.dumps({"sdk": sdk}) + "\n")


def pytest_collectreport(report):
    """A module that cannot be imported (e.g. an SDK without a name the suite imports) spoils the report's column."""
    path = os.environ.get("E2B_SUITE_REPORT")
    if path and report.failed:
        with open(path, "a") as out:
            out.write(json.dumps({"test": report.nodeid, "when": "collect", "outcome": "failed"}) + "\n")


def pytest_runtest_logreport(report):
    """One line per phase that decides a test's outcome: its call, or a setup/teardown that did not pass."""
    path = os.environ.get("E2B_SUITE_REPORT")
    if not path or (report.when != "call" and report.passed):
        return
    reason = getattr(report, "wasxfail", None)
    if report.skipped and reason is None and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2].removeprefix("Skipped: ")
    line = {"test": report.nodeid, "when": report.when, "outcome": report.outcome, "xfail": hasattr(report, "wasxfail")}
    if reason is not None:
        line["reason"] = reason
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")


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
