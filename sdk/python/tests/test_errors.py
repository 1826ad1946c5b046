"""Errors as exceptions carrying the API's code, message and status: unknown ids, a bad key, another tenant's sandbox,
an ended sandbox, a paused one, invalid limits, and the admin-only pool resize and config."""

from __future__ import annotations

import pytest

import support
from sandkasten import (
    Client,
    Conflict,
    Forbidden,
    NotFound,
    Paused,
    Sandbox,
    SandkastenError,
    TemplateBuildFailed,
    Unauthorized,
    Unprocessable,
)


def test_unknown_sandbox_is_not_found() -> None:
    with pytest.raises(NotFound) as caught:
        Sandbox.connect("sb-0000000000000000")
    assert caught.value.status == 404 and caught.value.code == "not_found" and caught.value.message


def test_unknown_key_is_unauthorized() -> None:
    with pytest.raises(Unauthorized) as caught:
        Sandbox.connect("sb-0000000000000000", api_key="not-a-key-of-this-server")
    assert caught.value.status == 401


def test_missing_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDKASTEN_API_KEY")
    with pytest.raises(ValueError, match="SANDKASTEN_API_KEY"):
        Client()


def test_another_tenants_sandbox_is_invisible(sbx: Sandbox) -> None:
    assert support.OTHER_KEY, "SANDKASTEN_SUITE_OTHER_API_KEY is not set"
    with pytest.raises(NotFound):
        Sandbox.connect(sbx.id, api_key=support.OTHER_KEY)
    with Client(api_key=support.OTHER_KEY) as other:
        assert sbx.id not in {info.id for info in other.list_sandboxes()}


def test_limits_out_of_range_are_unprocessable() -> None:
    with pytest.raises(Unprocessable) as caught:
        support.create(limits={"memory_bytes": 1})
    assert "memory" in caught.value.message


def test_an_ended_sandbox_is_a_conflict() -> None:
    sandbox = support.create()
    sandbox.kill()
    with pytest.raises(Conflict) as caught:
        sandbox.exec("true")
    assert caught.value.status == 409 and not isinstance(caught.value, Paused)
    assert sandbox.refresh().state == "destroyed"
    sandbox.kill()  # killing it again changes nothing
    sandbox.close()


def test_a_paused_sandbox_raises_paused_until_resumed() -> None:
    with support.create() as sandbox:
        assert sandbox.pause().state == "paused"
        with pytest.raises(Paused) as caught:
            sandbox.exec("true")
        assert caught.value.code == "paused" and isinstance(caught.value, Conflict)
        assert sandbox.resume().state == "running"
        assert sandbox.exec("echo back").stdout == "back\n"


def test_a_filesystem_pause_keeps_the_files_and_the_resume_starts_fresh_processes() -> None:
    with support.create() as sandbox:
        sandbox.files.write("/workspace/kept.txt", "kept")
        paused = sandbox.pause(mode="filesystem")
        assert (paused.state, paused.pause_mode) == ("paused", "filesystem")
        with pytest.raises(Paused):
            sandbox.exec("true")
        resumed = sandbox.resume()
        assert (resumed.state, resumed.pause_mode) == ("running", None)
        assert sandbox.files.read_text("/workspace/kept.txt") == "kept"


def test_pool_resize_needs_an_admin(client: Client) -> None:
    assert isinstance(client.pools.list(), list)
    with pytest.raises((Forbidden, NotFound)) as caught:
        client.pools.resize("no-such-pool", min=0, max=1)
    assert isinstance(caught.value, SandkastenError) and caught.value.message


def test_templates_are_listed_and_removing_one_needs_an_admin(client: Client) -> None:
    assert isinstance(client.templates.list(), list)
    with pytest.raises((Forbidden, NotFound)) as caught:
        client.templates.delete("no-such-template")
    assert isinstance(caught.value, SandkastenError) and caught.value.message


def test_an_admin_builds_a_template_and_a_failing_step_raises_with_its_output(client: Client) -> None:
    spec = {
        "name": "sdk-built",
        "base": "host",
        "files": [{"src": "note.txt", "dest": "/opt/sdk/note.txt"}],
        "run": ["echo sdk-step-output; cp /opt/sdk/note.txt /opt/copy.txt"],
    }
    with pytest.raises(Forbidden):
        client.templates.build(spec, files={"note.txt": "n"})
    output: list = []
    events: list = []
    with Client(api_key=support.ADMIN_KEY) as admin:
        built = admin.templates.build(spec, files={"note.txt": b"a note\n"}, on_output=output.append, on_event=events.append)
        assert built.name == "sdk-built" and built.digest.startswith("sha256:") and len(built.layers) == 2
        assert not built.cached and "sdk-step-output" in "".join(output)
        assert [event["event"] for event in events][-1] == "done"
        again = admin.templates.build(spec, files={"note.txt": b"a note\n"})
        assert again.cached and again.digest == built.digest
        with pytest.raises(TemplateBuildFailed) as failed:
            admin.templates.build('name = "sdk-broken"\nbase = "host"\nrun = ["echo sdk-visible; exit 3"]\n')
        assert failed.value.step == {"index": 0, "title": "run echo sdk-visible; exit 3"}
        assert "sdk-visible" in failed.value.output and "exited with 3" in failed.value.message
        with pytest.raises(Unprocessable) as bad:
            admin.templates.build({"name": "sdk-bad", "base": "host", "rn": []})
        assert "rn" in bad.value.message
    assert "sdk-built" in [template.name for template in client.templates.list()]
    assert "sdk-broken" not in [template.name for template in client.templates.list()]


def test_the_config_is_for_admins_and_shows_no_key(client: Client) -> None:
    with pytest.raises(Forbidden) as caught:
        client.config()
    assert "admin" in caught.value.message
    with Client(api_key=support.ADMIN_KEY) as admin:
        info = admin.config()
    names = [tenant["name"] for tenant in info.config["tenants"]]
    assert "t1" in names and "ops" in names
    assert all(key == "<redacted>" for tenant in info.config["tenants"] for key in tenant["api_keys"])
    assert support.ADMIN_KEY not in str(info.config) and support.OTHER_KEY not in str(info.config)
    assert info.default_limits.memory_bytes and any(tier.tier == "process" and tier.available for tier in info.tiers)
