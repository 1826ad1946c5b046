"""What E2B's base image has and programs rely on, through the sync and async `e2b` SDK: `python` and `pip` (Python
3), `node`/`npm`, `git`, `curl`, the user `user` with its home `/home/user` as HOME and working directory; the
SDK's "killed or reached its end of life" error for a command its sandbox is killed under; the SDK's MCP gateway
failure ("Failed to start MCP gateway") for `mcp`, since sandkasten has no gateway; and `sudo` for `user` (the
sandbox's root, served by the agent: uid 0 of the sandbox's user namespace, no capabilities)."""

import threading

import pytest

import support
from e2b import AsyncSandbox, CommandExitException, Sandbox, SandboxException

TOOLS = {
    "python -c 'import sys; print(sys.version_info[0])'": "3",
    "pip --version": "python 3",
    "node -e 'console.log(1 + 1)'": "2",
    "npm --version": ".",
    "git --version": "git version",
    "curl --version": "curl ",
    "id -un; echo $HOME; pwd": "user\n/home/user\n/home/user",
}


def test_base_image_tools_and_home_are_there(sbx):
    for command, expected in TOOLS.items():
        result = sbx.commands.run(command)
        assert expected in result.stdout, f"{command}: {result.stdout!r} {result.stderr!r}"
    assert sbx.commands.run("python -m pip --version").exit_code == 0


@pytest.mark.asyncio
async def test_base_image_tools_async():
    sandbox = await support.acreate(AsyncSandbox)
    try:
        result = await sandbox.commands.run("python -c 'print(6 * 7)' && pip --version")
        assert result.stdout.startswith("42\n") and "python 3" in result.stdout, result.stdout
    finally:
        await sandbox.kill()


@support.sdk_differs(
    not support.PROBES_UNAVAILABLE,
    "raises its 'likely due to sandbox timeout' TimeoutException for a killed sandbox (it tells a kill apart only by a "
    "reset connection, which the facade's HTTP/1.1 streams do not send)",
)
def test_a_command_whose_sandbox_is_killed_raises_the_sdk_s_killed_error():
    sandbox = support.create(Sandbox)
    threading.Timer(1.5, lambda: Sandbox.kill(sandbox.sandbox_id)).start()
    with pytest.raises(SandboxException, match="killed or reached its end of life"):
        sandbox.commands.run("sleep 60", timeout=30)


@support.sdk_differs(
    not support.PROBES_UNAVAILABLE,
    "raises its 'likely due to sandbox timeout' TimeoutException for a killed sandbox (it tells a kill apart only by a "
    "reset connection, which the facade's HTTP/1.1 streams do not send)",
)
@pytest.mark.asyncio
async def test_an_async_command_whose_sandbox_is_killed_raises_the_sdk_s_killed_error():
    import asyncio

    sandbox = await support.acreate(AsyncSandbox)

    async def kill_soon():
        await asyncio.sleep(1.5)
        await AsyncSandbox.kill(sandbox.sandbox_id)

    killer = asyncio.create_task(kill_soon())
    with pytest.raises(SandboxException, match="killed or reached its end of life"):
        await sandbox.commands.run("sleep 60", timeout=30)
    await killer


def test_mcp_fails_as_a_failed_gateway_and_leaves_no_sandbox():
    tag = support.unique("mcp")
    with pytest.raises(SandboxException, match="Failed to start MCP gateway") as raised:
        Sandbox.create(mcp={"exa": {"apiKey": "x"}}, metadata=support.tagged({"mcp": tag}))
    assert "mcp-gateway" in str(raised.value), raised.value
    from e2b import SandboxQuery

    left = Sandbox.list(query=SandboxQuery(metadata={"mcp": tag})).next_items()
    assert left == [], "the SDK kills the sandbox whose gateway failed"


def test_sudo_gives_the_sandbox_s_root(sbx):
    assert sbx.commands.run("sudo whoami").stdout.strip() == "root"
    assert sbx.commands.run("sudo -u user id -un").stdout.strip() == "user"
    assert sbx.commands.run("sudo -i whoami").stdout.strip() == "root"
    assert sbx.commands.run("echo piped | sudo tee /tmp/by-root >/dev/null; stat -c %U /tmp/by-root").stdout == "root\n"
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("sudo sh -c 'exit 3'")
    assert failed.value.exit_code == 3


def test_the_user_s_home_starts_with_the_skeleton_useradd_copies(sbx):
    listed = sbx.commands.run("ls -A /home/user").stdout.split()
    for name in (".bashrc", ".profile", ".bash_logout"):
        assert name in listed, listed
    assert sbx.commands.run("stat -c %U:%a /home/user/.bashrc").stdout.strip() == "user:644"
    # A login shell reads them as on E2B's image: .profile sources .bashrc.
    assert sbx.commands.run("bash -lc 'echo ${BASH_VERSION:+bash} $HOME'").stdout.strip() == "bash /home/user"
