"""`sandbox.get_host(port)` through the sync and async `e2b` SDKs: a server started in the sandbox (`python3 -m
http.server`, a background command) is reached at `https://{get_host(port)}` as E2B programs do; here the request goes to
the server's own address with that name as its `Host` (what a wildcard DNS record `*.DOMAIN` would do). Unlike E2B, a
sandbox's ports need its `traffic_access_token` (`e2b-traffic-access-token`) unless it was created with
`network={"allow_public_traffic": True}`; a port nothing listens on is a 502 naming it."""

import asyncio
import os
import time

import httpx
import pytest

import support
from e2b import AsyncSandbox, CommandExitException, Sandbox

SERVER = os.environ.get("E2B_SANDBOX_URL", "")
PAGE = "served from inside the sandbox"


def _headers(host: str, token: str | None) -> dict:
    headers = {"Host": host}
    if token:
        headers["e2b-traffic-access-token"] = token
    return headers


def _get(host: str, token: str | None = None, path: str = "/") -> httpx.Response:
    return httpx.get(SERVER + path, headers=_headers(host, token), timeout=30)


def _wait_served(host: str, token: str | None, path: str, limit: float = 30.0) -> httpx.Response:
    deadline = time.monotonic() + limit
    while True:
        response = _get(host, token, path)
        if response.status_code != 502 or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


def _check_host(sbx, port: int):
    host = sbx.get_host(port)
    assert host == f"{port}-{sbx.sandbox_id}.{sbx.sandbox_domain}"
    return host


def test_get_host_reaches_a_server_started_in_the_sandbox():
    sbx = support.create(Sandbox, timeout=300)
    try:
        sbx.files.write("/home/user/site/index.html", PAGE)
        sbx.commands.run("python3 -m http.server 8000", cwd="/home/user/site", background=True, timeout=0)
        host = _check_host(sbx, 8000)
        served = _wait_served(host, sbx.traffic_access_token, "/index.html")
        assert (served.status_code, served.text) == (200, PAGE), served.text
        refused = _get(host, None, "/index.html")
        assert refused.status_code == 403, refused.text
        assert "e2b-traffic-access-token" in refused.json()["message"]
        closed = _get(sbx.get_host(8001), sbx.traffic_access_token)
        assert closed.status_code == 502, closed.text
        assert closed.json()["port"] == 8001 and "nothing listens on port 8001" in closed.json()["message"]
    finally:
        sbx.kill()


def test_allow_public_traffic_serves_the_port_without_the_token():
    sbx = support.create(Sandbox, timeout=300, network={"allow_public_traffic": True})
    try:
        sbx.files.write("/home/user/site/index.html", PAGE)
        sbx.commands.run("python3 -m http.server 8000", cwd="/home/user/site", background=True, timeout=0)
        served = _wait_served(_check_host(sbx, 8000), None, "/index.html")
        assert (served.status_code, served.text) == (200, PAGE), served.text
        # Inbound traffic is not egress: the sandbox still reaches nothing outside.
        with pytest.raises(CommandExitException):
            sbx.commands.run("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), 3)'", timeout=30)
    finally:
        sbx.kill()


@pytest.mark.asyncio
async def test_get_host_through_the_async_sdk():
    sbx = await support.acreate(AsyncSandbox, timeout=300)
    try:
        await sbx.files.write("/home/user/site/index.html", PAGE)
        await sbx.commands.run("python3 -m http.server 8000", cwd="/home/user/site", background=True, timeout=0)
        host = _check_host(sbx, 8000)
        async with httpx.AsyncClient(timeout=30) as client:
            deadline = time.monotonic() + 30
            while True:
                served = await client.get(SERVER + "/index.html", headers=_headers(host, sbx.traffic_access_token))
                if served.status_code != 502 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert (served.status_code, served.text) == (200, PAGE), served.text
            refused = await client.get(SERVER + "/index.html", headers=_headers(host, "wrong-token"))
            assert refused.status_code == 403, refused.text
    finally:
        await sbx.kill()
