"""Snapshots and forks through the sync `e2b.Sandbox`: create_snapshot(mode="filesystem") and Sandbox.create(snapshot_id)
on its files, the default (full) mode refused with a message naming mode="filesystem", list_snapshots (filters and
paging) and delete_snapshot, and fork(count=2) giving two independent sandboxes with the source's files."""

import pytest

import support
from e2b import Sandbox, SandboxException, SandboxNotFoundException


def list_all(**kwargs) -> list:
    """Every page of `Sandbox.list_snapshots(**kwargs)` (bounded, so a paginator that never ends fails)."""
    paginator = Sandbox.list_snapshots(**kwargs)
    found = []
    for _ in range(100):
        if not paginator.has_next:
            return found
        found.extend(paginator.next_items())
    raise AssertionError("list_snapshots never ended")


@pytest.mark.skipif(
    not support.SNAPSHOT_MODES, reason="create_snapshot has no mode in this SDK (full snapshots need gVisor)"
)
def test_list_snapshots_pages_newest_first_by_cursor():
    with support.create(Sandbox) as sandbox:
        first = sandbox.create_snapshot(mode="filesystem")
        second = sandbox.create_snapshot(mode="filesystem")
        try:
            paginator = Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id, limit=1)
            pages = []
            while paginator.has_next:
                pages.append([info.snapshot_id for info in paginator.next_items()])
            assert pages == [[second.snapshot_id], [first.snapshot_id]], "newest first, one per page"
            with pytest.raises(SandboxException, match="400: Invalid next token"):
                Sandbox.list_snapshots(next_token="1").next_items()
            with pytest.raises(SandboxException, match="at most 100"):
                Sandbox.list_snapshots(limit=101).next_items()
        finally:
            Sandbox.delete_snapshot(first.snapshot_id)
            Sandbox.delete_snapshot(second.snapshot_id)


def test_a_full_snapshot_is_refused_naming_the_filesystem_mode(sbx):
    # The SDK's default mode is "full" (memory and files), which no sandkasten tier can save yet: it must raise,
    # tell the caller what to pass instead, and take no snapshot in its place.
    before = list_all(sandbox_id=sbx.sandbox_id)
    for kwargs in ({}, {"mode": "full"}):
        with pytest.raises(SandboxException) as refused:
            sbx.create_snapshot(**kwargs)
        assert 'mode="filesystem"' in str(refused.value), refused.value
        assert support.status_of(refused.value) == 400, refused.value
    assert list_all(sandbox_id=sbx.sandbox_id) == before
    assert sbx.commands.run("echo still here").stdout == "still here\n"


@pytest.mark.skipif(
    not support.SNAPSHOT_MODES, reason="create_snapshot has no mode in this SDK (full snapshots need gVisor)"
)
def test_a_filesystem_snapshot_starts_new_sandboxes_on_its_files_and_is_deleted(sbx):
    sbx.files.write("/home/user/snap/a.txt", "before the snapshot")
    name = support.unique("snap")
    snapshot = sbx.create_snapshot(name, mode="filesystem")
    try:
        assert snapshot.snapshot_id.startswith("sn-"), snapshot
        assert snapshot.names == [name]
        sbx.files.write("/home/user/snap/a.txt", "after the snapshot")

        restored = support.create(Sandbox, template=snapshot.snapshot_id)
        try:
            assert restored.sandbox_id != sbx.sandbox_id
            assert restored.files.read("/home/user/snap/a.txt") == "before the snapshot"
            assert restored.commands.run("cat /home/user/snap/a.txt").stdout == "before the snapshot"
        finally:
            restored.kill()
        assert sbx.files.read("/home/user/snap/a.txt") == "after the snapshot"

        ids = [info.snapshot_id for info in list_all(sandbox_id=sbx.sandbox_id)]
        assert snapshot.snapshot_id in ids
        assert [info.snapshot_id for info in list_all(name=name)] == [snapshot.snapshot_id]
        paginator = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id, limit=1)
        assert len(paginator.next_items()) == 1
    finally:
        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is False
    assert snapshot.snapshot_id not in [info.snapshot_id for info in list_all()]
    with pytest.raises(SandboxException) as gone:
        support.create(Sandbox, template=snapshot.snapshot_id)
    assert support.status_of(gone.value) == 404, gone.value


@pytest.mark.skipif(
    not support.SNAPSHOT_MODES, reason="create_snapshot has no mode in this SDK (full snapshots need gVisor)"
)
def test_another_tenants_snapshot_is_not_found(sbx):
    import os

    other_key = os.environ.get("E2B_SUITE_OTHER_API_KEY")
    if not other_key:
        pytest.skip("E2B_SUITE_OTHER_API_KEY is not set")
    snapshot = sbx.create_snapshot(mode="filesystem")
    try:
        assert snapshot.snapshot_id not in [info.snapshot_id for info in list_all(api_key=other_key)]
        with pytest.raises(SandboxException) as foreign:
            support.create(Sandbox, template=snapshot.snapshot_id, api_key=other_key)
        assert support.status_of(foreign.value) == 404, foreign.value
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, api_key=other_key) is False
    finally:
        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True


def test_fork_gives_two_independent_sandboxes_with_the_files(sbx):
    sbx.files.write("/home/user/fork/a.txt", "from the source")
    forks = sbx.fork(count=2)
    assert len(forks) == 2, forks
    for fork in forks:
        assert isinstance(fork, Sandbox), fork
        support.CREATED.append(fork.sandbox_id)
    try:
        first, second = forks
        assert len({first.sandbox_id, second.sandbox_id, sbx.sandbox_id}) == 3
        for fork in forks:
            assert fork.files.read("/home/user/fork/a.txt") == "from the source"
        first.files.write("/home/user/fork/a.txt", "changed in the first")
        first.commands.run("echo new > /home/user/fork/only-first.txt")
        assert second.files.read("/home/user/fork/a.txt") == "from the source"
        assert sbx.files.read("/home/user/fork/a.txt") == "from the source"
        assert not second.files.exists("/home/user/fork/only-first.txt")
        assert first.files.read("/home/user/fork/only-first.txt") == "new\n"
    finally:
        for fork in forks:
            fork.kill()


def test_fork_of_an_unknown_sandbox_raises_not_found():
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork("sb-0123456789abcdef", count=1)
