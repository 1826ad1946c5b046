"""Lifecycle through the sync API: create options as the server reports them, listing by metadata, the timeout,
usage metrics, snapshots (take, list, get, create from, delete) and forks (independent copies)."""

from __future__ import annotations

import pytest

import support
from sandkasten import BadRequest, Client, Conflict, Limits, NotFound


def test_create_options_are_applied() -> None:
    limits = Limits(memory_bytes=128 << 20, pids=64, timeout_ms=5000)
    with support.create(limits=limits, env={"COLOUR": "blue"}, metadata=support.labels(role="opts")) as sandbox:
        info = sandbox.info
        assert info.state == "running" and info.id.startswith("sb-")
        assert info.limits.memory_bytes == 128 << 20 and info.limits.pids == 64 and info.limits.timeout_ms == 5000
        assert info.env_names == ["COLOUR"] and info.metadata["role"] == "opts"
        assert sandbox.exec("echo $COLOUR").stdout == "blue\n"


def test_list_by_metadata_and_set_timeout(client: Client) -> None:
    sandbox = client.create_sandbox(metadata=support.labels(role="listed"), timeout=120)
    support.record(sandbox.id)
    listed = client.list_sandboxes(metadata={"suite": support.RUN_ID, "role": "listed"}, state="running")
    assert [info.id for info in listed] == [sandbox.id]
    before = sandbox.info.expires_at
    assert sandbox.set_timeout(3600).expires_at > before
    assert client.connect(sandbox.id).info.id == sandbox.id
    sandbox.kill()


def test_list_in_pages_follows_the_cursor_and_misses_nothing(client: Client) -> None:
    made = []
    for _ in range(3):
        sandbox = client.create_sandbox(metadata=support.labels(role="paged"), timeout=120)
        made.append(support.record(sandbox.id))
    query = {"suite": support.RUN_ID, "role": "paged"}
    whole = [info.id for info in client.list_sandboxes(metadata=query)]
    assert sorted(whole) == sorted(made)
    paged = [info.id for info in client.list_sandboxes(metadata=query, page_size=1)]
    assert paged == whole, "oldest first, page by page"
    assert [info.id for info in client.list_sandboxes(metadata=query, page_size=2)] == whole
    with pytest.raises(BadRequest):
        client.list_sandboxes(page_size=0)
    for sandbox_id in made:
        client.connect(sandbox_id).kill()


def test_metrics_show_the_disk_a_file_takes() -> None:
    with support.create() as sandbox:
        sandbox.exec("head -c 8388608 /dev/zero > /workspace/blob")
        metrics = sandbox.metrics()
        assert metrics.sandbox_id == sandbox.id and metrics.cpus > 0 and metrics.memory_limit_bytes > 0
        latest = metrics.samples[-1]
        assert latest.disk_used_bytes >= 8 << 20 and latest.disk_total_bytes >= latest.disk_used_bytes
        assert latest.memory_used_bytes > 0 and 0.0 <= latest.cpu_used_pct <= 100.0
        assert sandbox.metrics(to_ms=latest.timestamp_ms - 3_600_000).samples == []


def test_snapshot_restore_and_delete(client: Client) -> None:
    with support.create() as source:
        source.files.write("/workspace/state.txt", "saved")
        snapshot = source.snapshot(name="sdk-suite")
        assert snapshot.id.startswith("sn-") and snapshot.sandbox_id == source.id and snapshot.name == "sdk-suite"
    assert client.snapshots.get(snapshot.id).state == "ready"
    assert client.snapshots.get(snapshot.id).transfers == [], "nothing moves once it is saved"
    assert snapshot.id in {listed.id for listed in client.snapshots.list()}
    restored = client.create_sandbox(snapshot=snapshot.id, metadata=support.labels())
    support.record(restored.id)
    assert restored.files.read_text("/workspace/state.txt") == "saved"
    restored.kill()
    client.snapshots.delete(snapshot.id)
    with pytest.raises(NotFound):
        client.snapshots.get(snapshot.id)


def test_fork_makes_independent_copies() -> None:
    with support.create() as source:
        source.files.write("/workspace/shared.txt", "before")
        copies = source.fork(2)
        for copy in copies:
            support.record(copy.id)
        assert len(copies) == 2 and len({copy.id for copy in copies} | {source.id}) == 3
        copies[0].files.write("/workspace/shared.txt", "changed")
        assert copies[1].files.read_text("/workspace/shared.txt") == "before"
        assert source.files.read_text("/workspace/shared.txt") == "before"
        for copy in copies:
            copy.kill()
            copy.close()


def test_memory_snapshot_follows_the_tier(client: Client) -> None:
    """gVisor and microVMs save processes with the files: a restored copy's program goes on counting. The process tier
    cannot, and says so with a Conflict that names the tier that can."""
    with support.create() as source:
        if source.isolation.tier not in ("gvisor", "microvm"):
            with pytest.raises(Conflict) as caught:
                source.snapshot(memory=True)
            assert "gvisor" in caught.value.message
            return
        ticker = "import time\nn = 0\nwhile True:\n    n += 1\n"
        ticker += "    open('/tmp/tick', 'w').write(str(n))\n    time.sleep(0.02)"
        source.exec(["python3", "-c", ticker], background=True)
        assert source.exec("for i in $(seq 100); do [ -s /tmp/tick ] && break; sleep 0.05; done; cat /tmp/tick").ok
        snapshot = source.snapshot(memory=True)
        assert snapshot.memory and snapshot.state == "ready"
    restored = client.create_sandbox(snapshot=snapshot.id, metadata=support.labels())
    support.record(restored.id)
    first = int(restored.files.read_text("/tmp/tick") or 0)
    later = [int(restored.exec("sleep 0.1; cat /tmp/tick").stdout or 0) for _ in range(20)]
    assert any(value > first for value in later), f"the restored program did not run on: {first} then {later}"
    restored.kill()
    client.snapshots.delete(snapshot.id)
