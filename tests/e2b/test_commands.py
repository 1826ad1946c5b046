"""`sandbox.commands` through the sync `e2b.Sandbox`: foreground and background commands, exit-code errors, envs, cwd,
users (the default `user` in /home/user, and `root`), stdin, streamed output reaching the callbacks while the command
still runs, timeouts, and list/connect/kill/send_stdin of running commands. One sandbox serves the module; each test
uses its own files."""

import pytest

import support
from e2b import CommandExitException, CommandHandle, SandboxException, TimeoutException


def test_run_returns_stdout_stderr_and_exit_code(sbx):
    result = sbx.commands.run("echo out; echo err >&2")
    assert result.exit_code == 0
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    assert result.error in (None, "")


def test_nonzero_exit_raises_command_exit_exception_with_the_output(sbx):
    with pytest.raises(CommandExitException) as raised:
        sbx.commands.run("echo partial; echo 'something broke' >&2; exit 3")
    error = raised.value
    assert error.exit_code == 3
    assert error.stdout == "partial\n"
    assert "something broke" in error.stderr


def test_commands_run_under_bash_with_pipes_and_quotes(sbx):
    result = sbx.commands.run("printf '%s\\n' \"a b\" c | wc -l && echo $0")
    assert result.stdout.split() == ["2", "/bin/bash"]


def test_default_user_is_user_in_a_writable_home(sbx):
    result = sbx.commands.run("whoami; pwd; echo $HOME; id -u; touch ./made-by-user && stat -c %U ./made-by-user")
    name, cwd, home, uid, owner = result.stdout.split()
    assert (name, cwd, home, owner) == ("user", "/home/user", "/home/user", "user")
    assert uid != "0"


def test_user_root_is_uid_zero_inside(sbx):
    result = sbx.commands.run("id -u; whoami", user="root")
    assert result.stdout.split() == ["0", "root"]


def test_envs_and_cwd_apply_to_one_command(sbx):
    sbx.commands.run("mkdir -p /home/user/workdir")
    result = sbx.commands.run("echo $ONE-$TWO; pwd", envs={"ONE": "1", "TWO": "zwei"}, cwd="/home/user/workdir")
    assert result.stdout == "1-zwei\n/home/user/workdir\n"
    assert sbx.commands.run("echo ${ONE:-unset}").stdout == "unset\n"


def test_missing_cwd_fails(sbx):
    with pytest.raises((CommandExitException, SandboxException)):
        sbx.commands.run("pwd", cwd="/home/user/no/such/dir")


def test_stdout_and_stderr_callbacks_receive_output_before_the_command_ends(sbx):
    # The command prints, then waits for a file that only the callback creates: if output were delivered at the end,
    # the callback would never run and the command would hit its timeout instead of finishing.
    gate_out, gate_err = support.unique("/tmp/gate-out"), support.unique("/tmp/gate-err")
    seen_out, seen_err = [], []

    def on_stdout(chunk):
        seen_out.append(chunk)
        if "ready-out" in chunk:
            sbx.files.write(gate_out, "")

    def on_stderr(chunk):
        seen_err.append(chunk)
        if "ready-err" in chunk:
            sbx.files.write(gate_err, "")

    script = (
        f"echo ready-out; until [ -e {gate_out} ]; do sleep 0.02; done; "
        f"echo ready-err >&2; until [ -e {gate_err} ]; do sleep 0.02; done; echo finished"
    )
    result = sbx.commands.run(script, on_stdout=on_stdout, on_stderr=on_stderr, timeout=30)
    assert "".join(seen_out) == "ready-out\nfinished\n" == result.stdout
    assert "".join(seen_err) == "ready-err\n" == result.stderr


def test_command_timeout_raises_and_ends_the_command(sbx):
    marker = support.unique("timeout-marker")
    with pytest.raises(TimeoutException):
        sbx.commands.run(f"sleep 30 # {marker}", timeout=1)
    support.wait_until(
        lambda: all(marker not in " ".join(p.args) for p in sbx.commands.list()),
        "the timed-out command to disappear from commands.list()",
    )


def test_background_command_ends_at_its_timeout(sbx):
    marker = support.unique("bg-timeout-marker")
    handle = sbx.commands.run(f"sleep 30 # {marker}", background=True, timeout=1)
    with pytest.raises((TimeoutException, CommandExitException)):
        handle.wait()
    support.wait_until(
        lambda: all(marker not in " ".join(p.args) for p in sbx.commands.list()),
        "the timed-out background command to disappear from commands.list()",
    )


def test_background_command_is_listed_connected_to_and_killed(sbx):
    gate = support.unique("/tmp/gate-bg")
    handle = sbx.commands.run(
        f"echo first; until [ -e {gate} ]; do sleep 0.02; done; echo second; sleep 60",
        background=True,
        envs={"BG": "1"},
        cwd="/tmp",
    )
    assert isinstance(handle, CommandHandle)
    assert handle.pid > 0
    listed = {p.pid: p for p in sbx.commands.list()}
    assert handle.pid in listed, listed
    process = listed[handle.pid]
    assert process.cmd == "/bin/bash"
    assert any(gate in arg for arg in process.args)
    assert process.envs.get("BG") == "1"
    assert process.cwd == "/tmp"

    # A second handle on the running command sees what it prints from now on.
    attached = sbx.commands.connect(handle.pid, timeout=20)
    assert attached.pid == handle.pid
    sbx.files.write(gate, "")
    for stdout, _stderr, _pty in attached:
        if stdout and "second" in stdout:
            break
    else:
        pytest.fail("the connected handle did not see 'second'")
    attached.disconnect()

    assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as raised:
        handle.wait()
    assert raised.value.exit_code != 0
    assert "first" in raised.value.stdout
    support.wait_until(lambda: handle.pid not in {p.pid for p in sbx.commands.list()}, "the killed command to go")
    assert sbx.commands.kill(handle.pid) is False


def test_handle_kill_and_wait_on_a_finished_background_command(sbx):
    done = sbx.commands.run("echo quick", background=True)
    assert done.wait().stdout == "quick\n"
    slow = sbx.commands.run("sleep 60", background=True)
    assert slow.kill() is True
    with pytest.raises(CommandExitException):
        slow.wait()


def test_background_wait_streams_to_callbacks(sbx):
    handle = sbx.commands.run("echo one; echo two >&2", background=True)
    out, err = [], []
    result = handle.wait(on_stdout=out.append, on_stderr=err.append)
    assert "".join(out) == "one\n" and "".join(err) == "two\n"
    assert result.exit_code == 0


def test_send_stdin_reaches_the_command(sbx):
    handle = sbx.commands.run("head -n 2", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "line one\n")
    handle.send_stdin(b"line two\n")
    assert handle.wait().stdout == "line one\nline two\n"


def test_close_stdin_ends_input(sbx):
    handle = sbx.commands.run("wc -c", background=True, stdin=True)
    handle.send_stdin("12345")
    handle.close_stdin()
    assert handle.wait().stdout.strip() == "5"


def test_stdin_is_empty_without_stdin_true(sbx):
    # Without stdin=True the command must not hang waiting for input.
    assert sbx.commands.run("cat; echo eof", timeout=20).stdout == "eof\n"


def test_send_stdin_to_an_unknown_pid_fails(sbx):
    with pytest.raises(SandboxException):
        sbx.commands.send_stdin(999999, "x")


def test_connect_to_an_unknown_pid_fails(sbx):
    with pytest.raises(SandboxException):
        sbx.commands.connect(999999)


def test_binary_and_large_output_survive(sbx):
    result = sbx.commands.run("head -c 300000 /dev/zero | tr '\\0' 'x'; printf '\\xc3\\xa4\\n'")
    assert result.stdout == "x" * 300000 + "ä\n"
