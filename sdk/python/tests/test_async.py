"""The async surface end to end: every operation through AsyncSandbox / AsyncClient (the conftest's session check
holds it to that), async callbacks awaited in order, concurrent commands, and errors raised as on the sync side."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator, List

import pytest

import support
from sandkasten import AsyncClient, AsyncSandbox, Forbidden, NotFound, Paused, Unauthorized


@pytest.fixture(scope="module")
async def asbx() -> AsyncIterator[AsyncSandbox]:
    sandbox = await AsyncSandbox.create(metadata=support.labels(surface="async"))
    support.record(sandbox.id)
    yield sandbox
    await sandbox.kill()
    await sandbox.close()


@pytest.fixture(scope="module")
async def aclient() -> AsyncIterator[AsyncClient]:
    async with AsyncClient() as client:
        yield client


async def test_async_with_create_kills_on_exit(aclient: AsyncClient) -> None:
    async with AsyncSandbox.create(metadata=support.labels()) as sandbox:
        support.record(sandbox.id)
        assert (await sandbox.exec("echo hi")).stdout == "hi\n"
    assert (await aclient.connect(sandbox.id)).info.state == "destroyed"


async def test_commands_stream_concurrently_with_async_callbacks(asbx: AsyncSandbox) -> None:
    seen: List[str] = []

    async def collect(chunk: str) -> None:
        await asyncio.sleep(0)
        seen.append(chunk)

    streamed, plain = await asyncio.gather(
        asbx.exec("for i in a b c; do echo $i; done", on_stdout=collect),
        asbx.exec(["sh", "-c", "echo $X >&2"], env={"X": "y"}, cwd="/tmp", stdin="", timeout=5),
    )
    assert "".join(seen) == "a\nb\nc\n" == streamed.stdout and plain.stderr == "y\n"


async def test_background_commands(asbx: AsyncSandbox) -> None:
    reader = await asbx.exec("cat", background=True)
    await reader.send_stdin("ping")
    await reader.close_stdin()
    assert (await reader.wait()).stdout == "ping"
    sleeper = await asbx.exec("sleep 60", background=True)
    await sleeper.signal(15)
    assert (await sleeper.wait()).signal == 15
    killed = await asbx.exec("sleep 60", background=True)
    await killed.kill()
    assert (await asbx.commands.handle(killed.id).wait()).signal == 9
    assert {reader.id, sleeper.id, killed.id} <= {command.id for command in await asbx.commands.list()}


async def test_a_pty_command_runs_on_a_terminal_that_can_be_resized(asbx: AsyncSandbox) -> None:
    once = await asbx.exec("stty size", pty=(100, 30))
    assert once.stdout == "30 100\r\n"
    handle = await asbx.exec("read line; stty size", background=True, pty=(80, 24))
    await handle.resize(132, 43)
    await handle.send_stdin("\n")
    assert "43 132" in (await handle.wait()).stdout


async def test_files(asbx: AsyncSandbox, tmp_path: Path) -> None:
    await asbx.files.mkdir("/workspace/a/b", parents=True)
    await asbx.files.write("/workspace/a/b/f.txt", "content")
    assert await asbx.files.read_text("/workspace/a/b/f.txt") == "content"
    assert (await asbx.files.stat("/workspace/a/b/f.txt")).size == 7
    assert [entry.name for entry in await asbx.files.list("/workspace/a/b")] == ["f.txt"]
    await asbx.files.rename("/workspace/a/b/f.txt", "/workspace/a/g.txt")
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "u.txt").write_text("up")
    assert (await asbx.files.upload_dir(tmp_path / "up", "/workspace/a/up")).files == 1
    await asbx.files.download_dir("/workspace/a", tmp_path / "down")
    assert (tmp_path / "down" / "g.txt").read_text() == "content"
    assert (tmp_path / "down" / "up" / "u.txt").read_text() == "up"
    await asbx.files.remove("/workspace/a", recursive=True)
    with pytest.raises(NotFound):
        await asbx.files.read("/workspace/a/g.txt")


async def test_code_and_contexts(asbx: AsyncSandbox) -> None:
    await asbx.run_code("z = 6")
    out: List[str] = []
    cell = await asbx.run_code("print('p'); z * 7", on_stdout=out.append)
    assert cell.text == "42" and out == ["p\n"]
    context = await asbx.contexts.create("python")
    await asbx.run_code("w = 1", context=context)
    assert (await asbx.contexts.restart(context)).execution_count == 0
    assert context.id in {listed.id for listed in await asbx.contexts.list()}
    await asbx.contexts.delete(context)


async def test_scan(aclient: AsyncClient) -> None:
    report = await aclient.scan("rm -rf /", "bash")
    assert report.findings and report.findings[0].line == 1, report


async def test_metrics(asbx: AsyncSandbox) -> None:
    metrics = await asbx.metrics()
    assert metrics.sandbox_id == asbx.id and metrics.samples
    assert metrics.samples[-1].disk_total_bytes > 0


async def test_network_and_egress(asbx: AsyncSandbox) -> None:
    assert (await asbx.set_network({"mode": "allowlist", "allow": ["ok.example"]})).allow == ["ok.example"]
    await asbx.exec("curl -s -m 5 -o /dev/null http://no.example/ || true")
    assert any(event.host == "no.example" and event.decision == "refused" for event in await asbx.egress())


async def test_lifecycle_snapshot_fork(aclient: AsyncClient) -> None:
    sandbox = await aclient.create_sandbox(metadata=support.labels(), timeout=300)
    support.record(sandbox.id)
    await sandbox.files.write("/workspace/keep.txt", "kept")
    await sandbox.set_timeout(600)
    await sandbox.pause()
    with pytest.raises(Paused):
        await sandbox.exec("true")
    assert (await sandbox.resume()).state == "running"
    assert (await sandbox.refresh()).state == "running"
    assert (await sandbox.pause(mode="filesystem")).pause_mode == "filesystem"
    assert (await sandbox.resume()).state == "running"
    assert await sandbox.files.read_text("/workspace/keep.txt") == "kept"
    snapshot = await sandbox.snapshot()
    assert (await aclient.snapshots.get(snapshot.id)).id == snapshot.id
    assert snapshot.id in {listed.id for listed in await aclient.snapshots.list()}
    copies = await sandbox.fork(1)
    support.record(copies[0].id)
    assert await copies[0].files.read_text("/workspace/keep.txt") == "kept"
    await copies[0].kill()
    await copies[0].close()
    restored = await AsyncSandbox.create(snapshot=snapshot.id, metadata=support.labels())
    support.record(restored.id)
    assert await restored.files.read_text("/workspace/keep.txt") == "kept"
    await restored.kill()
    await restored.close()
    await aclient.snapshots.delete(snapshot.id)
    listed = await aclient.list_sandboxes(metadata={"suite": support.RUN_ID}, state="running")
    assert sandbox.id in {info.id for info in listed}
    paged = await aclient.list_sandboxes(metadata={"suite": support.RUN_ID}, state="running", page_size=1)
    assert [info.id for info in paged] == [info.id for info in listed], "page by page, the same list"
    await sandbox.kill()


async def test_errors_and_the_rest_of_the_client(aclient: AsyncClient) -> None:
    with pytest.raises(NotFound):
        await AsyncSandbox.connect("sb-0000000000000000")
    with pytest.raises(Unauthorized):
        await AsyncSandbox.connect("sb-0000000000000000", api_key="wrong")
    run = await aclient.run("console.log(1 + 1)", "node")
    assert run.stdout == "2\n"
    out: List[str] = []
    assert (await aclient.run(command="echo streamed", on_stdout=out.append)).exit_code == 0 and out == ["streamed\n"]
    await aclient.secrets.put("SDK_ASYNC", "v", ["a.example"])
    assert "SDK_ASYNC" in {secret.name for secret in await aclient.secrets.list()}
    assert (await aclient.secrets.get("SDK_ASYNC")).version == 1
    await aclient.secrets.delete("SDK_ASYNC")
    assert isinstance(await aclient.pools.list(), list)
    assert isinstance(await aclient.templates.list(), list)
    with pytest.raises((Forbidden, NotFound)):
        await aclient.pools.resize("none", min=0, max=1)
    with pytest.raises((Forbidden, NotFound)):
        await aclient.templates.delete("none")
    with pytest.raises(Forbidden):
        await aclient.config()
    with pytest.raises(Forbidden):
        await aclient.templates.build({"name": "sdk-async", "base": "host", "run": ["true"]})
    async with AsyncClient(api_key=support.ADMIN_KEY) as admin:
        built = await admin.templates.build(dockerfile="FROM host\nRUN echo async > /opt/async.txt\n", name="sdk-async")
        assert built.name == "sdk-async" and len(built.layers) == 1
        info = await admin.config()
    assert "ops" in [tenant["name"] for tenant in info.config["tenants"]] and info.tiers
