"""Commands through the sync Sandbox: results with every field the API has, argv/env/cwd/stdin, limits that fire,
streaming callbacks over the exec event stream, and background commands (stdin, signals, kill, replayed output)."""

from __future__ import annotations

from typing import List

import pytest

from sandkasten import CommandFailed, ExecResult, Sandbox, Unprocessable


def test_exec_returns_output_exit_usage_and_timings(sbx: Sandbox) -> None:
    result = sbx.exec("echo out; echo err >&2; exit 3")
    assert isinstance(result, ExecResult)
    assert (result.stdout, result.stderr, result.exit_code, result.signal) == ("out\n", "err\n", 3, None)
    assert not result.timed_out and result.limit is None and not result.ok
    assert result.sandbox_id == sbx.id and result.isolation == sbx.isolation
    assert result.timings.first_command > 0 and result.duration_ms > 0
    assert result.usage.memory_peak_bytes > 0
    with pytest.raises(CommandFailed, match="exit 3"):
        result.check()


def test_exec_argv_env_cwd_and_stdin(sbx: Sandbox) -> None:
    result = sbx.exec(["sh", "-c", 'pwd; echo "$GREETING"; cat'], cwd="/tmp", env={"GREETING": "hej"}, stdin="in")
    assert result.check().stdout == "/tmp\nhej\nin"


def test_binary_output_keeps_its_bytes(sbx: Sandbox) -> None:
    result = sbx.exec("printf '\\000\\001\\377'")
    assert result.stdout_bytes == b"\x00\x01\xff" and result.stdout == ""


def test_timeout_reports_the_time_limit(sbx: Sandbox) -> None:
    result = sbx.exec("sleep 30", timeout=0.5)
    assert result.timed_out and result.limit == "time" and result.exit_code != 0


def test_invalid_command_is_unprocessable_with_the_api_message(sbx: Sandbox) -> None:
    with pytest.raises(Unprocessable) as caught:
        sbx.exec("true", env={"1-not-a-name": "x"})
    assert caught.value.code == "unprocessable" and caught.value.status == 422 and "env" in caught.value.message


def test_streaming_callbacks_get_the_chunks_in_order(sbx: Sandbox) -> None:
    out: List[str] = []
    err: List[str] = []
    script = "for i in 1 2 3; do echo $i; sleep 0.05; done; echo bad >&2; exit 4"
    result = sbx.exec(script, on_stdout=out.append, on_stderr=err.append)
    assert "".join(out) == "1\n2\n3\n" and "".join(err) == "bad\n"
    assert (result.stdout, result.stderr, result.exit_code) == ("1\n2\n3\n", "bad\n", 4)


def test_background_command_reads_stdin_and_is_waited_for(sbx: Sandbox) -> None:
    handle = sbx.exec("cat; echo done", background=True)
    assert handle.id.startswith("cmd-") and handle.pid
    handle.send_stdin("first ")
    handle.send_stdin("second", eof=True)
    chunks: List[str] = []
    result = handle.wait(on_stdout=chunks.append)
    assert result.exit_code == 0 and result.stdout == "first seconddone\n" == "".join(chunks)
    listed = {command.id: command for command in sbx.commands.list()}
    assert listed[handle.id].state == "exited" and listed[handle.id].exit_code == 0


def test_background_command_signal_and_kill(sbx: Sandbox) -> None:
    term = sbx.exec(["sleep", "60"], background=True)
    term.signal("SIGTERM")
    assert term.wait().signal == 15
    killed = sbx.exec(["sleep", "60"], background=True)
    killed.kill()
    assert killed.wait().signal == 9


def test_background_output_replays_from_an_offset(sbx: Sandbox) -> None:
    handle = sbx.exec("echo 0123456789", background=True)
    assert handle.wait().stdout == "0123456789\n"
    again = sbx.commands.handle(handle.id)
    assert again.wait(since=5).stdout == "56789\n"


def test_a_pty_command_runs_on_a_terminal_that_can_be_resized(sbx: Sandbox) -> None:
    once = sbx.exec("tty; stty size", pty=(100, 30))
    assert once.stdout == "/dev/pts/0\r\n30 100\r\n" and once.exit_code == 0
    handle = sbx.exec("read line; stty size", background=True, pty=(80, 24))
    handle.resize(132, 43)
    handle.send_stdin("\n")
    assert "43 132" in handle.wait().stdout
