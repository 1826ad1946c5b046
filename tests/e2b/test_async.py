"""The async clients (`e2b.AsyncSandbox`, `e2b_code_interpreter.AsyncSandbox`): lifecycle, commands with streamed
callbacks, errors, background commands with stdin and kill, files, and run_code, each as an asyncio program would."""

import asyncio
import datetime

import pytest
import pytest_asyncio

import support
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FileNotFoundException,
    FileType,
    FilesystemEventType,
    InvalidArgumentException,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    TimeoutException,
)
from e2b_code_interpreter import AsyncSandbox as AsyncCodeSandbox

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def asbx():
    sandbox = await support.acreate(AsyncSandbox)
    yield sandbox
    await sandbox.kill()


async def test_create_connect_list_info_timeout_kill():
    tag = support.unique("async")
    sandbox = await support.acreate(AsyncSandbox, timeout=90, envs={"MODE": "async"}, metadata={"tag": tag})
    assert (await sandbox.commands.run("echo $MODE")).stdout == "async\n"

    info = await sandbox.get_info()
    assert info.metadata["tag"] == tag
    assert datetime.timedelta(seconds=80) <= info.end_at - info.started_at <= datetime.timedelta(seconds=100)
    await sandbox.set_timeout(400)
    assert (await sandbox.get_info()).end_at > info.end_at

    paginator = AsyncSandbox.list(query=SandboxQuery(metadata={"tag": tag}))
    listed = []
    while paginator.has_next:
        listed.extend(await paginator.next_items())
    assert [i.sandbox_id for i in listed] == [sandbox.sandbox_id]

    other = await AsyncSandbox.connect(sandbox.sandbox_id)
    await other.files.write("/home/user/async.txt", "shared")
    assert await sandbox.files.read("/home/user/async.txt") == "shared"

    assert await sandbox.is_running()
    assert await sandbox.kill() is True
    assert await sandbox.is_running() is False
    assert await AsyncSandbox.kill(sandbox.sandbox_id) is False
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.get_info(sandbox.sandbox_id)
    with pytest.raises(support.SandboxGoneException):
        await sandbox.commands.run("true")


async def test_pause_with_memory_and_to_the_filesystem():
    sandbox = await support.acreate(AsyncSandbox, timeout=120)
    try:
        await sandbox.files.write("/home/user/kept.txt", "kept")
        background = await sandbox.commands.run("sleep 600", background=True)
        assert await sandbox.pause() is True
        again = await AsyncSandbox.connect(sandbox.sandbox_id)
        assert background.pid in [p.pid for p in await again.commands.list()], "with memory the process lives on"
        assert await sandbox.pause(**support.FILESYSTEM_PAUSE) is True
        assert (await sandbox.get_info()).state.value == "paused"
        again = await AsyncSandbox.connect(sandbox.sandbox_id)
        assert await again.files.read("/home/user/kept.txt") == "kept"
        assert background.pid not in [p.pid for p in await again.commands.list()], "to the filesystem it does not"
        assert (await again.commands.run("echo cold boot")).stdout == "cold boot\n"
    finally:
        await sandbox.kill()


async def test_watch_dir_streams_events_until_stopped(asbx):
    base = support.unique("/home/user/astream")
    await asbx.files.make_dir(base)
    events = []
    exits = []
    handle = await asbx.files.watch_dir(base, on_event=events.append, on_exit=exits.append, recursive=True)
    await asbx.files.write(f"{base}/one.txt", "1")
    await asbx.commands.run(f"mkdir {base}/sub && echo 2 > {base}/sub/two.txt")
    deadline = asyncio.get_running_loop().time() + 10
    wanted = {("one.txt", FilesystemEventType.CREATE), ("sub/two.txt", FilesystemEventType.CREATE)}
    while not wanted <= {(e.name, e.type) for e in events}:
        assert asyncio.get_running_loop().time() < deadline, f"events seen: {events}"
        await asyncio.sleep(0.05)
    await handle.stop()
    count = len(events)
    await asbx.files.write(f"{base}/after.txt", "after the stop")
    await asyncio.sleep(0.5)
    assert len(events) == count, "no event after stop()"


@support.needs_watch_entry()
async def test_a_streamed_watch_carries_the_entry_when_asked(asbx):
    base = support.unique("/home/user/aentries")
    await asbx.files.make_dir(base)
    events = []
    handle = await asbx.files.watch_dir(base, on_event=events.append, include_entry=True)
    try:
        await asbx.files.write(f"{base}/one.txt", "1")
        deadline = asyncio.get_running_loop().time() + 10
        while not any(e.name == "one.txt" and e.type == FilesystemEventType.CREATE for e in events):
            assert asyncio.get_running_loop().time() < deadline, f"events seen: {events}"
            await asyncio.sleep(0.05)
    finally:
        await handle.stop()
    created = next(e for e in events if e.name == "one.txt" and e.type == FilesystemEventType.CREATE)
    assert created.entry is not None and (created.entry.name, created.entry.path) == ("one.txt", f"{base}/one.txt")


async def test_a_watch_of_a_removed_directory_ends(asbx):
    base = support.unique("/home/user/agone")
    await asbx.files.make_dir(base)
    exits = []
    await asbx.files.watch_dir(base, on_event=lambda e: None, on_exit=exits.append)
    await asbx.files.remove(base)
    deadline = asyncio.get_running_loop().time() + 10
    while not exits:
        assert asyncio.get_running_loop().time() < deadline, "the watch did not end"
        await asyncio.sleep(0.05)


async def test_command_result_and_exit_error(asbx):
    result = await asbx.commands.run("echo hi; echo ho >&2", user="root")
    assert (result.stdout, result.stderr, result.exit_code) == ("hi\n", "ho\n", 0)
    with pytest.raises(CommandExitException) as raised:
        await asbx.commands.run("echo oops >&2; exit 42")
    assert raised.value.exit_code == 42 and raised.value.stderr == "oops\n"
    assert (await asbx.commands.run("pwd; whoami", cwd="/tmp")).stdout == "/tmp\nuser\n"


async def test_callbacks_stream_while_the_command_runs(asbx):
    gate = support.unique("/tmp/async-gate")
    seen = []

    async def on_stdout(chunk):
        seen.append(chunk)
        if "ready" in chunk:
            await asbx.files.write(gate, "")

    result = await asbx.commands.run(
        f"echo ready; until [ -e {gate} ]; do sleep 0.02; done; echo done", on_stdout=on_stdout, timeout=30
    )
    assert "".join(seen) == "ready\ndone\n" == result.stdout


async def test_timeout_raises(asbx):
    with pytest.raises(TimeoutException):
        await asbx.commands.run("sleep 30", timeout=1)


async def test_background_stdin_list_and_kill(asbx):
    reader = await asbx.commands.run("head -n 1", background=True, stdin=True)
    await asbx.commands.send_stdin(reader.pid, "async line\n")
    assert (await reader.wait()).stdout == "async line\n"

    sleeper = await asbx.commands.run("sleep 60", background=True)
    assert sleeper.pid in [p.pid for p in await asbx.commands.list()]
    attached = await asbx.commands.connect(sleeper.pid)
    assert attached.pid == sleeper.pid
    assert await asbx.commands.kill(sleeper.pid) is True
    with pytest.raises(CommandExitException):
        await sleeper.wait()
    assert await asbx.commands.kill(sleeper.pid) is False


async def test_close_stdin_handle_kill_and_connect_output(asbx):
    counter = await asbx.commands.run("wc -c", background=True, stdin=True)
    await counter.send_stdin("1234")
    await counter.close_stdin()
    assert (await counter.wait()).stdout.strip() == "4"

    gate = support.unique("/tmp/async-connect-gate")
    printer = await asbx.commands.run(
        f"until [ -e {gate} ]; do sleep 0.02; done; echo after-connect; sleep 60", background=True
    )
    seen = []
    attached = await asbx.commands.connect(printer.pid, on_stdout=seen.append, timeout=20)
    await asbx.files.write(gate, "")
    for _ in range(200):
        if "after-connect" in "".join(seen):
            break
        await asyncio.sleep(0.05)
    assert "after-connect" in "".join(seen)
    assert await printer.kill() is True
    with pytest.raises(CommandExitException):
        await attached.wait()


async def test_concurrent_commands(asbx):
    results = await asyncio.gather(*(asbx.commands.run(f"echo {i}") for i in range(8)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]


async def test_files(asbx):
    base = support.unique("/home/user/async-files")
    await asbx.files.write(f"{base}/a.txt", "text")
    await asbx.files.write_files([{"path": f"{base}/b.bin", "data": b"\x00\x01"}])
    assert await asbx.files.read(f"{base}/a.txt") == "text"
    assert bytes(await asbx.files.read(f"{base}/b.bin", format="bytes")) == b"\x00\x01"
    chunks = [chunk async for chunk in await asbx.files.read(f"{base}/a.txt", format="stream")]
    assert b"".join(chunks) == b"text"
    assert sorted(e.name for e in await asbx.files.list(base)) == ["a.txt", "b.bin"]
    assert await asbx.files.exists(f"{base}/a.txt")
    assert (await asbx.files.get_info(f"{base}/a.txt")).type == FileType.FILE
    assert await asbx.files.make_dir(f"{base}/d") is True
    moved = await asbx.files.rename(f"{base}/a.txt", f"{base}/d/a.txt")
    assert moved.path == f"{base}/d/a.txt"
    await asbx.files.remove(f"{base}/d")
    assert not await asbx.files.exists(f"{base}/d")
    with pytest.raises(FileNotFoundException):
        await asbx.files.read(f"{base}/missing")


async def test_file_metadata_root_files_and_signed_urls(asbx):
    import httpx

    base = support.unique("/home/user/async-meta")
    info = await asbx.files.write(f"{base}/t.txt", "x", metadata={"Kind": "async"})
    assert info.metadata == {"kind": "async"}
    assert (await asbx.files.get_info(f"{base}/t.txt")).metadata == {"kind": "async"}
    moved = await asbx.files.rename(f"{base}/t.txt", f"{base}/u.txt")
    assert moved.metadata == {"kind": "async"}
    await asbx.files.write(f"{base}/u.txt", "y")
    assert (await asbx.files.get_info(f"{base}/u.txt")).metadata is None
    private = support.unique("/tmp/async-root")
    await asbx.commands.run(f"mkdir -m 700 {private}", user="root")
    await asbx.files.write(f"{private}/r.txt", "root's", user="root")
    assert await asbx.files.read(f"{private}/r.txt", user="root") == "root's"
    assert (await asbx.files.get_info(f"{private}/r.txt", user="root")).owner == "root"
    with pytest.raises(SandboxException):
        await asbx.files.read(f"{private}/r.txt")
    async with httpx.AsyncClient(headers={"Host": f"49983-{asbx.sandbox_id}.{asbx.sandbox_domain}"}) as client:
        assert (await client.get(asbx.download_url(f"{base}/u.txt"))).text == "y"
        upload = asbx.upload_url(f"{base}/up.txt", use_signature_expiration=30)
        assert (await client.post(upload, files={"file": ("up.txt", b"by url")})).status_code == 200
        expired = asbx.download_url(f"{base}/u.txt", use_signature_expiration=-5)
        assert (await client.get(expired)).status_code == 401
    assert await asbx.files.read(f"{base}/up.txt") == "by url"


@support.sdk_differs(
    not support.READS_IS_SYMLINK,
    "reports a symlink as its target's type (it predates envd's is_symlink, as with E2B's own envd)",
)
async def test_files_answer_as_envd_does(asbx):
    base = support.unique("/home/user/async-envd")
    await asbx.files.write(f"{base}/a/z.txt", "x")
    await asbx.files.write(f"{base}/b.txt", "12345")
    await asbx.commands.run(f"cd {base} && ln -s b.txt link && ln -s a dirlink")
    assert await asbx.files.remove(f"{base}/missing") is None
    assert await asbx.files.make_dir(f"{base}/a") is False
    with pytest.raises(InvalidArgumentException, match="not a directory"):
        await asbx.files.make_dir(f"{base}/b.txt")
    link = await asbx.files.get_info(f"{base}/link")
    assert (link.type, link.symlink_target, link.permissions) == (FileType.SYMLINK, f"{base}/b.txt", "Lrwxrwxrwx")
    listed = [entry.path.removeprefix(base + "/") for entry in await asbx.files.list(base, depth=2)]
    assert listed == ["a", "a/z.txt", "b.txt", "dirlink", "link"]
    with pytest.raises(InvalidArgumentException, match="not a directory"):
        await asbx.files.list(f"{base}/b.txt")


@support.sdk_differs(
    support.PUBLIC_WITH_NETWORK,
    "sends allowPublicTraffic=true with any network option, so those sandboxes' ports need no traffic token",
)
async def test_update_network_replaces_the_egress_policy_live_async():
    sandbox = await support.acreate(AsyncSandbox, network={"deny_out": ["0.0.0.0/0"], "allow_out": ["api.example.com"]})
    try:
        await sandbox.update_network({"deny_out": ["0.0.0.0/0"], "allow_out": ["*.example.org"]})
        policy = support.native_network_policy(sandbox.sandbox_id)
        assert (policy["mode"], policy["allow"]) == ("allowlist", ["*.example.org"]), policy
        refused = await sandbox.commands.run("curl -s -m 5 http://api.example.com/; echo")
        assert "not in the allowlist" in refused.stdout, refused.stdout
        await AsyncSandbox.update_network(sandbox.sandbox_id, {"deny_out": ["198.51.100.7"]})
        assert support.native_network_policy(sandbox.sandbox_id) == {"mode": "open", "allow": [], "deny": ["198.51.100.7"]}
        with pytest.raises(SandboxException) as raised:
            await sandbox.update_network({"deny_out": ["10.0.0.0/8"]})
        assert "not supported" in str(raised.value)
        assert support.native_network_policy(sandbox.sandbox_id)["mode"] == "open", "a refused update changes nothing"
    finally:
        await sandbox.kill()


async def test_sudo_gives_the_sandbox_s_root_async(asbx):
    assert (await asbx.commands.run("sudo whoami")).stdout.strip() == "root"
    assert (await asbx.commands.run("sudo -u user id -un")).stdout.strip() == "user"
    with pytest.raises(CommandExitException) as failed:
        await asbx.commands.run("sudo sh -c 'exit 3'")
    assert failed.value.exit_code == 3


@support.sdk_differs(
    support.ASKS_FOR_INTERNET,
    "sends allow_internet_access=True by default (E2B's default), so its sandboxes are online without network options",
)
@support.needs_newer_listing()
async def test_list_pages_by_cursor_filters_and_reports_info():
    tag = support.unique("async-paging")
    sandboxes = [await support.acreate(AsyncSandbox, metadata={"tag": tag}) for _ in range(3)]
    try:
        infos = [await AsyncSandbox.get_info(sandbox.sandbox_id) for sandbox in sandboxes]
        by_id = sorted(infos, key=lambda info: info.sandbox_id)
        newest_first = [info.sandbox_id for info in sorted(by_id, key=lambda info: info.started_at, reverse=True)]
        paginator = AsyncSandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=2)
        pages = []
        while paginator.has_next:
            pages.append([info.sandbox_id for info in await paginator.next_items()])
        assert pages == [newest_first[:2], newest_first[2:]]
        since = infos[1].started_at
        oldest_first = [
            info.sandbox_id
            for info in sorted(sorted(by_id, key=lambda i: i.sandbox_id, reverse=True), key=lambda i: i.started_at)
            if info.started_at >= since
        ]
        query = SandboxQuery(metadata={"tag": tag}, started_after=since, template="base")
        ascending = await AsyncSandbox.list(query=query, order="asc").next_items()
        assert [info.sandbox_id for info in ascending] == oldest_first
        info = await sandboxes[0].get_info()
        assert (info.name, info.envd_version) == ("base", "0.6.3")
        assert info.lifecycle == {"on_timeout": "kill", "auto_resume": False}
        assert info.allow_internet_access is False and info.network["deny_out"] == ["0.0.0.0/0"]
        with pytest.raises(SandboxException, match="400: Invalid next token"):
            await AsyncSandbox.list(next_token="not-a-token").next_items()
        with pytest.raises(SandboxException, match="at most 100"):
            await AsyncSandbox.list(limit=500).next_items()
    finally:
        for sandbox in sandboxes:
            await sandbox.kill()


async def test_code_interpreter_async():
    sandbox = await support.acreate(AsyncCodeSandbox)
    try:
        await sandbox.run_code("state = [1, 2]")
        execution = await sandbox.run_code("state.append(3); sum(state)")
        assert execution.text == "6"
        streamed = []
        await sandbox.run_code("print('async log')", on_stdout=lambda m: streamed.append(m.line))
        assert streamed == ["async log\n"]
        failed = await sandbox.run_code("undefined_name")
        assert failed.error.name == "NameError"
        context = await sandbox.create_code_context(language="javascript")
        assert (await sandbox.run_code("[1, 2].length", context=context)).text == "2"
        await sandbox.run_code("globalThis.kept = 5", context=context)
        assert context.id in [c.id for c in await sandbox.list_code_contexts()]
        await sandbox.restart_code_context(context)
        assert (await sandbox.run_code("typeof kept", context=context)).text == "undefined"
        await sandbox.remove_code_context(context)
        assert context.id not in [c.id for c in await sandbox.list_code_contexts()]
        with pytest.raises(TimeoutException):
            stuck = await sandbox.create_code_context()
            await sandbox.run_code("import time; time.sleep(30)", timeout=2, context=stuck)
    finally:
        await sandbox.kill()


async def test_code_interpreter_envs_and_cwd_async():
    sandbox = await support.acreate(AsyncCodeSandbox)
    try:
        execution = await sandbox.run_code("import os; os.environ.get('FOO')", envs={"FOO": "bar"})
        assert execution.text == "bar"
        assert (await sandbox.run_code("import os; os.environ.get('FOO', 'default')")).text == "default"
        js = await sandbox.run_code("process.env.FOO", envs={"FOO": "js"}, language="js")
        assert js.text == "js"
        await sandbox.files.make_dir("/home/user/async-ctx")
        context = await sandbox.create_code_context(cwd="/home/user/async-ctx")
        assert context.cwd == "/home/user/async-ctx"
        assert (await sandbox.run_code("import os; os.getcwd()", context=context)).text == "/home/user/async-ctx"
        listed = {c.id: c.cwd for c in await sandbox.list_code_contexts()}
        assert listed[context.id] == "/home/user/async-ctx"
    finally:
        await sandbox.kill()


async def test_code_interpreter_recovers_async():
    sandbox = await support.acreate(AsyncCodeSandbox)
    try:
        killed = await sandbox.run_code("import os\nos.kill(os.getpid(), 9)")
        assert killed.error is not None and killed.error.name == "ContextRestarting"
        assert (await sandbox.run_code("1 + 1")).text == "2"
        with pytest.raises(TimeoutException):
            await sandbox.run_code("import time\nwhile True:\n    time.sleep(0.05)", timeout=2)
        assert (await sandbox.run_code("2 + 2", timeout=20)).text == "4", "the abandoned cell was interrupted"

        async def kill_soon():
            await asyncio.sleep(2)
            await sandbox.kill()

        killer = asyncio.create_task(kill_soon())
        with pytest.raises(TimeoutException, match="sandbox was killed while the request was in progress"):
            await sandbox.run_code("import time; time.sleep(300)", timeout=300)
        await killer
    finally:
        await sandbox.kill()


async def test_code_interpreter_languages_async():
    sandbox = await support.acreate(AsyncCodeSandbox)
    try:
        assert (await sandbox.run_code("'text'", language="js")).text == "text"
        assert (await sandbox.run_code("await Promise.resolve(41 + 1)", language="js")).text == "42"
        imported = await sandbox.run_code("import { join } from 'path'\njoin('a', 'b')", language="js")
        assert imported.text == "a/b"
        await sandbox.run_code("X=7", language="bash")
        assert "".join((await sandbox.run_code("echo $X", language="bash")).logs.stdout) == "7\n"
        from e2b import SandboxException

        with pytest.raises(SandboxException) as raised:
            await sandbox.run_code("1", language="cobol")
        assert str(raised.value).startswith("400")
    finally:
        await sandbox.kill()


async def test_code_interpreter_languages_java_async():
    import os

    if not os.path.exists("/usr/bin/jshell"):
        pytest.skip("no JDK on this host (/usr/bin/jshell; scripts/setup.sh installs openjdk-17-jdk-headless)")
    sandbox = await support.acreate(AsyncCodeSandbox)
    try:
        await sandbox.run_code("var n = 41;", language="java")
        assert (await sandbox.run_code("n + 1", language="java")).text == "42"
        streamed = []
        printed = await sandbox.run_code(
            'System.out.println("async java");', language="java", on_stdout=lambda m: streamed.append(m.line)
        )
        assert printed.logs.stdout == ["async java\n"]
        assert streamed == ["async java\n"]
    finally:
        await sandbox.kill()


async def test_code_interpreter_display_async():
    sandbox = await support.acreate(AsyncCodeSandbox)
    try:
        shown = []
        execution = await sandbox.run_code(
            "from IPython.display import display, HTML\ndisplay(HTML('<p>x</p>'))\n41 + 1", on_result=shown.append
        )
        assert [r.html for r in execution.results] == ["<p>x</p>", None]
        assert execution.text == "42"
        assert [r.is_main_result for r in shown] == [False, True]
    finally:
        await sandbox.kill()


async def test_code_interpreter_chart_async():
    from e2b_code_interpreter.charts import BarChart

    sandbox = await support.acreate(AsyncCodeSandbox)
    try:
        execution = await sandbox.run_code(
            "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 4], label='n')\nplt.title('T')\nplt.show()"
        )
        chart = execution.results[0].chart
        assert isinstance(chart, BarChart) and chart.title == "T"
        assert [(b.label, b.value, b.group) for b in chart.elements] == [("a", 3, "n"), ("b", 4, "n")]
    finally:
        await sandbox.kill()
