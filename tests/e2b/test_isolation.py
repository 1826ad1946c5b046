"""Who may reach a sandbox through the facade, attacked from the SDK side: per-sandbox requests need that sandbox's
own access token (another sandbox's token, a made-up one or none are refused, and nothing of the sandbox leaks), and
another tenant's API key can neither see, connect to, extend nor kill the sandbox. Each refusal has a positive control
with the right credentials, so the test fails if the request itself is wrong."""

import base64
import json
import os

import httpx
import pytest

import support
from e2b import Sandbox, SandboxNotFoundException

SECRET = "isolation-secret-" + support.RUN_ID


@pytest.fixture(scope="module")
def pair():
    """Two sandboxes of this tenant; the first holds a secret file."""
    first, second = support.create(Sandbox), support.create(Sandbox)
    first.files.write("/home/user/secret.txt", SECRET)
    yield first, second
    first.kill()
    second.kill()


def envd(sandbox_id: str, token: str | None, method: str, path: str, **kwargs) -> httpx.Response:
    """A raw per-sandbox request, as the SDK sends it, with the given sandbox id and access token."""
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"}
    if token is not None:
        headers["X-Access-Token"] = token
    headers.update(kwargs.pop("headers", {}))
    with httpx.Client(base_url=os.environ["E2B_SANDBOX_URL"], timeout=30) as client:
        return client.request(method, path, headers=headers, **kwargs)


def read_secret(sandbox_id: str, token: str | None) -> httpx.Response:
    return envd(sandbox_id, token, "GET", "/files", params={"path": "/home/user/secret.txt", "username": "user"})


def run_cat(sandbox_id: str, token: str | None) -> httpx.Response:
    # Connect protocol, server stream with the JSON codec: one enveloped StartRequest.
    message = json.dumps(
        {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "cat /home/user/secret.txt"]}}
    ).encode()
    body = b"\x00" + len(message).to_bytes(4, "big") + message
    return envd(
        sandbox_id,
        token,
        "POST",
        "/process.Process/Start",
        content=body,
        headers={"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"},
    )


def streamed_stdout(response: httpx.Response) -> str:
    """The stdout a Connect server stream carried (its envelopes' `event.data.stdout`, base64 in the JSON codec)."""
    out, data = b"", response.content
    while len(data) >= 5:
        length = int.from_bytes(data[1:5], "big")
        message, data = data[5 : 5 + length], data[5 + length :]
        try:
            event = json.loads(message).get("event", {})
        except ValueError:
            continue
        out += base64.b64decode(event.get("data", {}).get("stdout", ""))
    return out.decode(errors="replace")


def refused(response: httpx.Response) -> bool:
    return response.status_code in (401, 403, 404, 502) and SECRET not in response.text


def start_refused(response: httpx.Response) -> bool:
    started = b'"start":{' in response.content.replace(b" ", b"")  # a StartResponse: a process was started
    return SECRET not in streamed_stdout(response) and SECRET not in response.text and not started


def test_own_token_reads_the_sandbox(pair):
    first, _ = pair
    assert read_secret(first.sandbox_id, first._envd_access_token).text == SECRET
    started = run_cat(first.sandbox_id, first._envd_access_token)
    assert started.status_code == 200 and streamed_stdout(started) == SECRET
    assert not start_refused(started)


def test_another_sandboxs_token_is_refused(pair):
    first, second = pair
    assert refused(read_secret(first.sandbox_id, second._envd_access_token))
    assert start_refused(run_cat(first.sandbox_id, second._envd_access_token))


def test_missing_or_made_up_tokens_are_refused(pair):
    first, _ = pair
    for token in (None, "", "e2b_" + "0" * 40, first._envd_access_token + "x"):
        assert refused(read_secret(first.sandbox_id, token)), token
        assert start_refused(run_cat(first.sandbox_id, token)), token


def test_the_api_key_is_not_a_sandbox_token(pair):
    first, _ = pair
    assert refused(read_secret(first.sandbox_id, os.environ["E2B_API_KEY"]))
    response = envd(
        first.sandbox_id,
        None,
        "GET",
        "/files",
        params={"path": "/home/user/secret.txt"},
        headers={"X-API-KEY": os.environ["E2B_API_KEY"], "Authorization": "Bearer " + os.environ["E2B_API_KEY"]},
    )
    assert refused(response)


@pytest.fixture(scope="module")
def other_key():
    key = os.environ.get("E2B_SUITE_OTHER_API_KEY")
    if not key:
        pytest.skip("E2B_SUITE_OTHER_API_KEY (a second tenant's key) is not set; crates/cli/tests/e2b_sdk.rs sets it")
    return key


def test_another_tenant_cannot_see_or_touch_the_sandbox(pair, other_key):
    first, _ = pair
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(first.sandbox_id, api_key=other_key)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(first.sandbox_id, api_key=other_key)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(first.sandbox_id, 1, api_key=other_key)
    assert Sandbox.kill(first.sandbox_id, api_key=other_key) is False
    paginator = Sandbox.list(api_key=other_key)
    seen = []
    while paginator.has_next:
        seen.extend(info.sandbox_id for info in paginator.next_items())
    assert first.sandbox_id not in seen
    # Untouched: still running, timeout not shortened, secret intact.
    assert first.is_running()
    assert first.files.read("/home/user/secret.txt") == SECRET
