"""`sandbox.pty` through the sync and async `e2b` SDKs: `create(size, cwd, envs, user)` starts `bash -i -l` on a
pseudo-terminal of the sandbox, `send_stdin` (and `stream_input`) type into it and the output arrives through `on_pty` (and iteration),
`resize` changes the size the program sees (`stty size`), `connect(pid)` re-attaches with the output so far, `kill`
ends it (and is False once it is gone). A size of 0 is taken as envd takes it (a terminal of unknown size, `stty
size` says `0 0`); more than 1000 columns is an InvalidArgumentException, never a server error."""

import time

import pytest
import pytest_asyncio

import support
from e2b import AsyncSandbox, InvalidArgumentException, PtySize


def _wait_for(handle_output: list, needle: bytes, limit: float = 15.0) -> bytes:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        seen = b"".join(handle_output)
        if needle in seen:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} never arrived; got {b''.join(handle_output)!r}")


def _collect_in_background(handle, into: list):
    import threading

    def pump():
        try:
            for _stdout, _stderr, pty in handle:
                if pty:
                    into.append(pty)
        except Exception as error:  # the end of the stream (a kill) is an exception in the SDK
            into.append(repr(error).encode())

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def test_create_send_stdin_resize_connect_and_kill(sbx):
    terminal = sbx.pty.create(PtySize(rows=24, cols=80), cwd="/tmp", envs={"GREETING": "hi"}, timeout=60)
    try:
        output: list = []
        pump = _collect_in_background(terminal, output)
        sbx.pty.send_stdin(terminal.pid, b"echo $GREETING-$((20 + 22)) in $(pwd) as $(whoami); tty\n")
        _wait_for(output, b"hi-42 in /tmp as user")
        _wait_for(output, b"/dev/pts/")  # `tty`'s line may come in a later chunk

        sbx.pty.resize(terminal.pid, PtySize(rows=40, cols=132))
        sbx.pty.send_stdin(terminal.pid, b"stty size\n")
        _wait_for(output, b"40 132")

        # A second client re-attaches and gets what the terminal printed so far, then what follows.
        attached = sbx.pty.connect(terminal.pid, timeout=30)
        replay: list = []
        _collect_in_background(attached, replay)
        _wait_for(replay, b"hi-42 in /tmp as user")
        sbx.pty.send_stdin(terminal.pid, b"echo after-connect\n")
        _wait_for(replay, b"after-connect")

        assert terminal.pid in {process.pid for process in sbx.commands.list()}
        assert sbx.pty.kill(terminal.pid) is True
        pump.join(timeout=10)
        assert not pump.is_alive()
        support.wait_until(
            lambda: terminal.pid not in {process.pid for process in sbx.commands.list()}, "the pty ended"
        )
        assert sbx.pty.kill(terminal.pid) is False
    finally:
        sbx.pty.kill(terminal.pid)


def test_on_pty_gets_the_output_and_exit_ends_the_terminal(sbx):
    terminal = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
    sbx.pty.send_stdin(terminal.pid, b"echo on-pty-$((6 * 7)); exit 3\n")
    chunks: list = []
    try:
        result = terminal.wait(on_pty=chunks.append)
        code = result.exit_code
    except Exception as error:  # exit code != 0 raises CommandExitException carrying it
        code = getattr(error, "exit_code", None)
    assert b"on-pty-42" in b"".join(chunks)
    assert code == 3


def test_stream_input_types_each_chunk_in_order(sbx):
    if not hasattr(sbx.pty, "stream_input"):
        pytest.skip("no pty.stream_input in this SDK")
    terminal = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
    try:
        output: list = []
        _collect_in_background(terminal, output)
        sbx.pty.stream_input(terminal.pid, [b"echo streamed-", b"$((1 + 1))\n", "echo second-chunk\n"])
        seen = _wait_for(output, b"second-chunk\r\n")
        assert b"streamed-2" in seen
    finally:
        sbx.pty.kill(terminal.pid)


def test_user_root_gets_a_root_shell(sbx):
    terminal = sbx.pty.create(PtySize(rows=24, cols=80), user="root", timeout=60)
    try:
        output: list = []
        _collect_in_background(terminal, output)
        sbx.pty.send_stdin(terminal.pid, b"echo uid=$(id -u)\n")
        _wait_for(output, b"uid=0")
    finally:
        sbx.pty.kill(terminal.pid)


def test_a_size_of_zero_is_a_terminal_of_unknown_size_as_in_envd(sbx):
    terminal = sbx.pty.create(PtySize(rows=0, cols=0), timeout=60)
    try:
        output: list = []
        _collect_in_background(terminal, output)
        sbx.pty.send_stdin(terminal.pid, b"echo size=$(stty size)\n")
        _wait_for(output, b"size=0 0")
        # A resize to 0 is taken the same way.
        sbx.pty.resize(terminal.pid, PtySize(rows=0, cols=0))
    finally:
        sbx.pty.kill(terminal.pid)


def test_an_oversized_terminal_is_invalid_argument(sbx):
    with pytest.raises(InvalidArgumentException) as raised:
        sbx.pty.create(PtySize(rows=24, cols=100000), timeout=20)
    assert "cols must be at most 1000" in str(raised.value)
    terminal = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
    try:
        with pytest.raises(InvalidArgumentException):
            sbx.pty.resize(terminal.pid, PtySize(rows=5000, cols=80))
    finally:
        sbx.pty.kill(terminal.pid)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def asbx():
    sandbox = await support.acreate(AsyncSandbox)
    yield sandbox
    await sandbox.kill()


@pytest.mark.asyncio(loop_scope="module")
async def test_async_create_send_stdin_resize_connect_and_kill(asbx):
    import asyncio

    output: list = []
    terminal = await asbx.pty.create(PtySize(rows=24, cols=80), on_data=output.append, timeout=60)

    async def wait_for(chunks: list, needle: bytes) -> None:
        for _ in range(300):
            if needle in b"".join(chunks):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{needle!r} never arrived; got {b''.join(chunks)!r}")

    try:
        await asbx.pty.send_stdin(terminal.pid, b"echo async-$((40 + 2))\n")
        await wait_for(output, b"async-42")
        await asbx.pty.resize(terminal.pid, PtySize(rows=33, cols=111))
        await asbx.pty.send_stdin(terminal.pid, b"stty size\n")
        await wait_for(output, b"33 111")
        replay: list = []
        await asbx.pty.connect(terminal.pid, on_data=replay.append, timeout=30)
        await wait_for(replay, b"async-42")
        assert await asbx.pty.kill(terminal.pid) is True
    finally:
        await asbx.pty.kill(terminal.pid)
