"""`sandbox.get_host(port)` through the sync and async `e2b` SDKs: a server started in the sandbox (`python3 -m
http.server`, a background command) is reached at `https://{get_host(port)}` as E2B programs do; here the request goes to
the server's own address with that name as its `Host` (what a wildcard DNS record `*.DOMAIN` would do). Unlike E2B, a
sandbox's ports need its `traffic_access_token` (`e2b-traffic-access-token`) unless it was created with
`network={"allow_public_traffic": True}`; a port nothing listens on is a 502 naming it. A WebSocket upgrade through the
same name is bridged both ways."""

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


# A WebSocket echo server for the sandbox (standard library only): text frames come back as `echo:…`.
WEBSOCKET_ECHO = r"""
import base64, hashlib, http.server

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2 or head[0] & 0x0F == 8:
                return
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(head[1] & 0x7F)))
            reply = b"echo:" + data
            self.wfile.write(bytes([0x81, len(reply)]) + reply)
            self.wfile.flush()

http.server.HTTPServer(("127.0.0.1", 8765), Handler).serve_forever()
"""


def _websocket(host: str, token: str):
    """A WebSocket to the sandbox's port named by `host` through the server (raw: the suite's venv has no WebSocket
    client); returns the socket after the server's 101, or fails naming what came instead."""
    import base64
    import hashlib
    import socket
    import urllib.parse

    url = urllib.parse.urlsplit(SERVER)
    connection = socket.create_connection((url.hostname, url.port or 80), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /chat HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\ne2b-traffic-access-token: {token}\r\n\r\n"
    )
    connection.sendall(request.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = connection.recv(1)
        assert chunk, f"the connection ended before the upgrade: {head!r}"
        head += chunk
    accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
    assert head.startswith(b"HTTP/1.1 101") and accept in head, head
    return connection


def _exchange(connection, text: str) -> bytes:
    """Sends `text` as a masked text frame (as clients must) and returns the payload of the frame that answers."""
    mask = os.urandom(4)
    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(text.encode()))
    connection.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + payload)

    def exactly(size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = connection.recv(size - len(data))
            assert chunk, f"the connection ended inside a frame: {data!r}"
            data += chunk
        return data

    head = exactly(2)
    assert head[0] == 0x81, head
    return exactly(head[1] & 0x7F)


def test_a_websocket_to_a_port_is_bridged_both_ways():
    sbx = support.create(Sandbox, timeout=300)
    try:
        sbx.files.write("/home/user/ws.py", WEBSOCKET_ECHO)
        sbx.commands.run("python3 /home/user/ws.py", background=True, timeout=0)
        listening = "for i in $(seq 300); do (echo > /dev/tcp/127.0.0.1/8765) 2>/dev/null && exit 0; sleep 0.1; done; exit 1"
        sbx.commands.run(listening, timeout=60)
        connection = _websocket(_check_host(sbx, 8765), sbx.traffic_access_token)
        with connection:
            assert _exchange(connection, "hello") == b"echo:hello"
            assert _exchange(connection, "twice") == b"echo:twice"
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
