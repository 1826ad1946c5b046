"""Sandbox lifecycle through the sync `e2b.Sandbox`: create (template, timeout, envs, metadata), connect, list,
set_timeout, get_info, is_running, kill, the context manager, and what the SDK raises for a killed or unknown sandbox,
pause (and connect of a paused sandbox, auto_resume) and a wrong key. (Metrics: test_metrics.py; snapshots and forks:
test_snapshots.py.)"""

import datetime
import json
import os
import time
import urllib.error
import urllib.request

import pytest

import support
from e2b import (
    AuthenticationException,
    CommandExitException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)


def test_create_applies_timeout_envs_and_metadata():
    tag = support.unique("create")
    sandbox = support.create(Sandbox, timeout=120, envs={"GREETING": "hallo welt"}, metadata={"tag": tag})
    try:
        assert sandbox.sandbox_id
        assert sandbox.commands.run("echo $GREETING").stdout == "hallo welt\n"
        info = sandbox.get_info()
        assert info.sandbox_id == sandbox.sandbox_id
        assert info.metadata["tag"] == tag
        assert info.state == SandboxState.RUNNING
        lifetime = info.end_at - info.started_at
        assert datetime.timedelta(seconds=110) <= lifetime <= datetime.timedelta(seconds=130), lifetime
        assert info.cpu_count >= 1 and info.memory_mb >= 1
        assert sandbox.is_running()
    finally:
        assert sandbox.kill() is True


def test_create_accepts_the_default_templates_by_name():
    # E2B's default template of the base SDK ("base") and of the code interpreter are what unmodified programs ask for.
    sandbox = support.create(Sandbox, template="base")
    try:
        assert sandbox.commands.run("true").exit_code == 0
        assert sandbox.get_info().template_id
    finally:
        sandbox.kill()


def test_unknown_template_is_refused():
    with pytest.raises(SandboxException) as raised:
        support.create(Sandbox, template="no-such-template-" + support.unique("t"))
    assert support.status_of(raised.value) in (400, 404), raised.value


def test_connect_gives_a_second_handle_to_the_same_sandbox(sbx):
    sbx.files.write("/home/user/connect.txt", "written by the first handle")
    other = Sandbox.connect(sbx.sandbox_id)
    assert other.sandbox_id == sbx.sandbox_id
    assert other.files.read("/home/user/connect.txt") == "written by the first handle"
    other.commands.run("echo from the second > /home/user/connect2.txt")
    assert sbx.files.read("/home/user/connect2.txt") == "from the second\n"


def test_connect_with_a_later_timeout_extends_the_sandbox():
    sandbox = support.create(Sandbox, timeout=60)
    try:
        before = sandbox.get_info().end_at
        Sandbox.connect(sandbox.sandbox_id, timeout=600)
        after = sandbox.get_info().end_at
        assert after - before >= datetime.timedelta(seconds=500), (before, after)
    finally:
        sandbox.kill()


def test_list_shows_the_sandbox_with_its_metadata():
    tag = support.unique("list")
    sandbox = support.create(Sandbox, metadata={"tag": tag, "owner": "e2b-suite"})
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}))
        listed = []
        while paginator.has_next:
            listed.extend(paginator.next_items())
        assert [info.sandbox_id for info in listed] == [sandbox.sandbox_id]
        assert listed[0].metadata["owner"] == "e2b-suite"
        assert listed[0].state == SandboxState.RUNNING

        running = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, state=[SandboxState.RUNNING])).next_items()
        assert [info.sandbox_id for info in running] == [sandbox.sandbox_id]
        paused = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, state=[SandboxState.PAUSED])).next_items()
        assert paused == []

        everything = Sandbox.list()
        ids = []
        while everything.has_next:
            ids.extend(info.sandbox_id for info in everything.next_items())
        assert sandbox.sandbox_id in ids
    finally:
        sandbox.kill()


def _newest_first(infos):
    """E2B's default order: start time descending, ties by id ascending."""
    by_id = sorted(infos, key=lambda info: info.sandbox_id)
    return [info.sandbox_id for info in sorted(by_id, key=lambda info: info.started_at, reverse=True)]


@support.needs_newer_listing()
def test_list_pages_by_cursor_stay_stable_while_sandboxes_come_and_go():
    tag = support.unique("paging")
    first = [support.create(Sandbox, metadata={"tag": tag}) for _ in range(3)]
    later = []
    try:
        infos = [Sandbox.get_info(sandbox.sandbox_id) for sandbox in first]
        expected = _newest_first(infos)
        paginator = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=2)
        page = paginator.next_items()
        assert [info.sandbox_id for info in page] == expected[:2], "newest first, two per page"
        assert paginator.has_next and paginator.next_token
        # Between two pages: a newer sandbox starts and one already listed ends. An offset would now skip the
        # oldest; the cursor (start time, id of the last one listed) does not.
        later.append(support.create(Sandbox, metadata={"tag": tag}))
        Sandbox.kill(expected[0])
        rest = paginator.next_items()
        assert [info.sandbox_id for info in rest] == expected[2:]
        assert paginator.has_next is False and paginator.next_token is None

        oldest_first = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), order="asc", limit=1)
        ids = []
        while oldest_first.has_next:
            ids.extend(info.sandbox_id for info in oldest_first.next_items())
        assert ids == list(reversed(expected[1:])) + [later[0].sandbox_id]
    finally:
        for sandbox in first + later:
            Sandbox.kill(sandbox.sandbox_id)


@support.needs_newer_listing()
def test_list_filters_by_start_time_and_template():
    tag = support.unique("filters")
    base = support.create(Sandbox, metadata={"tag": tag})
    host = support.create(Sandbox, template="host", metadata={"tag": tag})
    try:
        base_info, host_info = Sandbox.get_info(base.sandbox_id), Sandbox.get_info(host.sandbox_id)
        assert host_info.started_at > base_info.started_at
        ids = lambda query: [info.sandbox_id for info in Sandbox.list(query=query).next_items()]  # noqa: E731
        # started_after is inclusive (at or after), whatever the caller's time zone.
        since = SandboxQuery(metadata={"tag": tag}, started_after=host_info.started_at.astimezone())
        assert ids(since) == [host.sandbox_id]
        assert set(ids(SandboxQuery(metadata={"tag": tag}, started_after=base_info.started_at))) == {
            base.sandbox_id,
            host.sandbox_id,
        }
        assert ids(SandboxQuery(metadata={"tag": tag}, template="host")) == [host.sandbox_id]
        assert ids(SandboxQuery(metadata={"tag": tag}, template="base")) == [base.sandbox_id]
        assert ids(SandboxQuery(metadata={"tag": tag}, template="no-such-template")) == []
    finally:
        base.kill()
        host.kill()


@support.needs_newer_listing()
def test_bad_list_parameters_are_refused_with_e2b_s_error():
    with pytest.raises(SandboxException, match="400.*limit.*at most 100"):
        Sandbox.list(limit=101).next_items()
    with pytest.raises(SandboxException, match="400: Invalid next token"):
        Sandbox.list(next_token="not-a-token").next_items()
    # A token of a newest-first list replayed for an oldest-first one would re-serve what was seen.
    tag = support.unique("order")
    sandboxes = [support.create(Sandbox, metadata={"tag": tag}) for _ in range(2)]
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=1)
        paginator.next_items()
        with pytest.raises(SandboxException, match="400: Invalid next token"):
            query = SandboxQuery(metadata={"tag": tag})
            Sandbox.list(query=query, next_token=paginator.next_token, order="asc").next_items()
        with pytest.raises(SandboxException, match="400: Invalid template: tags are not supported"):
            Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, template="base:v1")).next_items()
    finally:
        for sandbox in sandboxes:
            sandbox.kill()
    # The SDK never sends limit=0 (it drops a falsy limit); on the wire it is E2B's 400 too.
    url = os.environ["E2B_API_URL"].rstrip("/") + "/v2/sandboxes?limit=0"
    request = urllib.request.Request(url, headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 400
    body = json.loads(refused.value.read())
    assert body["code"] == 400 and "at least 1" in body["message"], body


@support.sdk_differs(
    support.ASKS_FOR_INTERNET,
    "sends allow_internet_access=True by default (E2B's default), so its sandboxes are online without network options",
)
def test_get_info_reports_what_e2b_returns():
    with support.create(Sandbox, lifecycle={"on_timeout": "pause", "auto_resume": True}) as sandbox:
        info = sandbox.get_info()
        assert (info.sandbox_id, info.template_id, info.name) == (sandbox.sandbox_id, "base", "base")
        assert info.cpu_count >= 1 and info.memory_mb > 0
        assert info.envd_version == "0.6.3"
        assert info.sandbox_domain is None
        assert info.lifecycle == {"on_timeout": "pause", "auto_resume": True}
        # No network options: sandkasten gives no network at all (E2B's default would be the internet).
        assert info.allow_internet_access is False
        assert info.network["deny_out"] == ["0.0.0.0/0"] and info.network["allow_out"] == []
        assert info.volume_mounts == []
        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": support.RUN_ID})).next_items()
        mine = [item for item in listed if item.sandbox_id == sandbox.sandbox_id]
        assert len(mine) == 1 and (mine[0].cpu_count, mine[0].memory_mb) == (info.cpu_count, info.memory_mb)
    with support.create(Sandbox, network={"deny_out": ["0.0.0.0/0"], "allow_out": ["api.example.com"]}) as sandbox:
        info = sandbox.get_info()
        assert info.lifecycle == {"on_timeout": "kill", "auto_resume": False}
        assert (info.network["allow_out"], info.network["deny_out"]) == (["api.example.com"], ["0.0.0.0/0"])
    with support.create(Sandbox, allow_internet_access=True) as sandbox:
        info = sandbox.get_info()
        assert info.allow_internet_access is True
        assert info.network["deny_out"] == []


def test_set_timeout_moves_end_at_and_get_info_reports_it(sbx):
    sbx.set_timeout(600)
    first = sbx.get_info()
    assert datetime.timedelta(seconds=590) <= first.end_at - datetime.datetime.now(first.end_at.tzinfo)
    sbx.set_timeout(60)
    second = sbx.get_info()
    assert second.end_at < first.end_at
    # The static form, by id, too.
    Sandbox.set_timeout(sbx.sandbox_id, 300)
    assert Sandbox.get_info(sbx.sandbox_id).end_at > second.end_at


def test_kill_ends_the_sandbox_and_later_calls_fail_as_the_sdk_reports():
    sandbox = support.create(Sandbox)
    sandbox_id = sandbox.sandbox_id
    sandbox.files.write("/home/user/before-kill.txt", "x")
    assert sandbox.kill() is True
    assert sandbox.is_running() is False
    # A second kill (static form) finds nothing: E2B answers False rather than raising.
    assert Sandbox.kill(sandbox_id) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox_id)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox_id)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(sandbox_id, 60)
    # The per-sandbox services answer as E2B's proxy does for a sandbox that is gone.
    with pytest.raises(support.SandboxGoneException):
        sandbox.commands.run("echo never")
    with pytest.raises(support.SandboxGoneException):
        sandbox.files.read("/home/user/before-kill.txt")
    with pytest.raises(support.SandboxGoneException):
        sandbox.files.write("/home/user/after-kill.txt", "x")


def test_unknown_sandbox_id_is_not_found():
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("does-not-exist-" + support.unique("id"))
    assert Sandbox.kill("does-not-exist-" + support.unique("id")) is False


def test_context_manager_kills_the_sandbox_on_exit():
    with support.create(Sandbox) as sandbox:
        sandbox_id = sandbox.sandbox_id
        assert sandbox.commands.run("echo inside").stdout == "inside\n"
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox_id)


def test_a_wrong_api_key_is_refused():
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "0" * 40, metadata=support.tagged(None))
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="e2b_" + "0" * 40).next_items()


def test_pause_keeps_the_sandbox_and_connect_resumes_it(sbx):
    # A paused sandbox is listed as paused, keeps its files and processes, and Sandbox.connect resumes it.
    sbx.files.write("/home/user/kept.txt", "written before the pause")
    background = sbx.commands.run("sleep 600", background=True)
    assert sbx.pause() is True
    assert sbx.pause() is False, "paused already"
    assert sbx.get_info().state == SandboxState.PAUSED
    listed = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
    assert sbx.sandbox_id in [item.sandbox_id for item in listed]
    # Without a state filter E2B lists running and paused sandboxes alike.
    everything = Sandbox.list(query=SandboxQuery(metadata={"suite": support.RUN_ID})).next_items()
    assert [item.state for item in everything if item.sandbox_id == sbx.sandbox_id] == [SandboxState.PAUSED]
    running = Sandbox.list(query=SandboxQuery(metadata={"suite": support.RUN_ID}, state=[SandboxState.RUNNING]))
    assert sbx.sandbox_id not in [item.sandbox_id for item in running.next_items()]
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.get_info().state == SandboxState.RUNNING
    assert again.files.read("/home/user/kept.txt") == "written before the pause"
    assert background.pid in [p.pid for p in again.commands.list()], "the process lived through the pause"
    assert again.commands.run("echo awake").stdout == "awake\n"


def test_a_filesystem_pause_keeps_the_files_and_connect_starts_it_fresh_on_them():
    # mode="filesystem" (keep_memory=False): only the files survive; everything else is released, and connect
    # cold-boots the sandbox on them under the same id.
    with support.create(Sandbox) as sandbox:
        sandbox.files.write("/home/user/kept.txt", "written before the pause")
        background = sandbox.commands.run("sleep 600", background=True)
        assert sandbox.pause(**support.FILESYSTEM_PAUSE) is True
        assert sandbox.pause(**support.FILESYSTEM_PAUSE) is False, "paused already"
        assert sandbox.get_info().state == SandboxState.PAUSED
        again = Sandbox.connect(sandbox.sandbox_id)
        assert again.sandbox_id == sandbox.sandbox_id
        assert again.get_info().state == SandboxState.RUNNING
        assert again.files.read("/home/user/kept.txt") == "written before the pause"
        assert background.pid not in [p.pid for p in again.commands.list()], "processes start fresh"
        assert again.commands.run("echo cold boot").stdout == "cold boot\n"
        assert sandbox.commands.run("echo same handle").stdout == "same handle\n", "the first handle works too"


def test_on_timeout_pause_in_filesystem_mode_pauses_at_the_timeout():
    lifecycle = {"on_timeout": {"action": "pause", "mode": "filesystem"}}
    with support.create(Sandbox, timeout=2, lifecycle=lifecycle) as sandbox:
        sandbox.files.write("/home/user/kept.txt", "kept")
        deadline = time.monotonic() + 20
        while sandbox.get_info().state != SandboxState.PAUSED:
            assert time.monotonic() < deadline, "not paused at its timeout"
            time.sleep(0.2)
        again = Sandbox.connect(sandbox.sandbox_id, timeout=60)
        assert again.files.read("/home/user/kept.txt") == "kept"


def test_auto_resume_resumes_on_a_request():
    with support.create(Sandbox, lifecycle={"on_timeout": "pause", "auto_resume": True}) as sandbox:
        assert sandbox.pause() is True
        assert sandbox.commands.run("echo resumed by a request").stdout == "resumed by a request\n"
        assert sandbox.get_info().state == SandboxState.RUNNING


def test_exit_code_error_carries_the_command_result(sbx):
    # The lifecycle's smallest command round trip, kept here so a broken process service fails this module too.
    with pytest.raises(CommandExitException) as raised:
        sbx.commands.run("exit 7")
    assert raised.value.exit_code == 7


@support.sdk_differs(
    support.ASKS_FOR_INTERNET,
    "sends allow_internet_access=True by default (E2B's default), so its sandboxes are online without network options",
)
def test_internet_access_goes_through_the_egress_proxy_and_never_to_the_metadata_address():
    # Without allow_internet_access (the SDK sends nothing) there is no network: nothing listens at the proxy.
    with support.create(Sandbox) as offline:
        result = offline.commands.run("curl -s -m 5 -o /dev/null -w '%{http_code}' http://169.254.169.254/; echo \" $?\"")
        assert result.stdout.strip() == "000 7", result.stdout
    # With it, public hosts go through the proxy, which still refuses the metadata address with its 403.
    with support.create(Sandbox, allow_internet_access=True) as online:
        assert online.commands.run("printenv HTTPS_PROXY").stdout.strip() == "http://127.0.0.1:3128"
        result = online.commands.run("curl -s -m 5 -o /dev/null -w '%{http_code}' http://169.254.169.254/latest")
        assert result.stdout.strip() == "403", result.stdout


@support.sdk_differs(
    support.PUBLIC_WITH_NETWORK,
    "sends allowPublicTraffic=true with any network option, so those sandboxes' ports need no traffic token",
)
def test_network_rules_become_an_egress_allowlist():
    network = {"deny_out": ["0.0.0.0/0"], "allow_out": ["api.example.com", "*.example.org"]}
    with support.create(Sandbox, network=network) as sandbox:
        policy = support.native_network_policy(sandbox.sandbox_id)
        assert policy["mode"] == "allowlist", policy
        assert policy["allow"] == ["api.example.com", "*.example.org"], policy
        # Anything else is refused by the proxy with the rule, the metadata address included.
        result = sandbox.commands.run("curl -s -m 5 http://169.254.169.254/latest; echo")
        assert "not in the allowlist" in result.stdout, result.stdout
    with support.create(Sandbox, network={"deny_out": ["198.51.100.7"]}) as sandbox:
        assert support.native_network_policy(sandbox.sandbox_id) == {"mode": "open", "allow": [], "deny": ["198.51.100.7"]}


@support.sdk_differs(
    support.PUBLIC_WITH_NETWORK,
    "sends allowPublicTraffic=true with any network option, so those sandboxes' ports need no traffic token",
)
def test_update_network_replaces_the_egress_policy_live():
    network = {"deny_out": ["0.0.0.0/0"], "allow_out": ["api.example.com"]}
    with support.create(Sandbox, network=network) as sandbox:
        sandbox.update_network({"deny_out": ["0.0.0.0/0"], "allow_out": ["*.example.org"]})
        policy = support.native_network_policy(sandbox.sandbox_id)
        assert (policy["mode"], policy["allow"]) == ("allowlist", ["*.example.org"]), policy
        refused = sandbox.commands.run("curl -s -m 5 http://api.example.com/; echo")
        assert "not in the allowlist" in refused.stdout, refused.stdout
        Sandbox.update_network(sandbox.sandbox_id, {"deny_out": ["198.51.100.7"]})
        assert support.native_network_policy(sandbox.sandbox_id) == {"mode": "open", "allow": [], "deny": ["198.51.100.7"]}
        sandbox.update_network({})
        assert support.native_network_policy(sandbox.sandbox_id)["mode"] == "none", "nothing asked: no network, as at create"
        with pytest.raises(SandboxException) as raised:
            sandbox.update_network({"deny_out": ["10.0.0.0/8"]})
        assert "not supported" in str(raised.value)
        assert support.native_network_policy(sandbox.sandbox_id)["mode"] == "none", "a refused update changes nothing"
    with pytest.raises(SandboxException):
        Sandbox.update_network(sandbox.sandbox_id, {"allow_out": ["x.example"]})  # killed


def test_features_sandkasten_lacks_are_refused_at_create():
    # Address ranges in network rules, MCP gateway or volumes: asking for them must fail loudly instead of silently
    # giving less (or more).
    for options in ({"network": {"deny_out": ["10.0.0.0/8"]}},):
        with pytest.raises(SandboxException) as raised:
            support.create(Sandbox, **options)
        assert "not supported" in str(raised.value), options
