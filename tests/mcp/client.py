"""The official `mcp` Python client against `sandkasten serve`'s MCP server, over one transport.

    client.py http|stdio

Environment: SANDKASTEN_URL (the server), MCP_KEY (tenant t1's key), MCP_OTHER_KEY (tenant t2's), SANDKASTEN_BIN
(the CLI, for stdio). Lists the tools, calls each, checks that a missing or wrong key is refused and that the other
tenant can neither see nor use t1's sandboxes. Prints `ended <id>` for each sandbox its session created that must be
gone once the session ended, and `persisted <id>` for the one created with `persist: true` (the Rust test checks
both on the host). Exits non-zero on the first failed check.
"""

import asyncio
import os
import re
import sys

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

URL = os.environ["SANDKASTEN_URL"]
KEY = os.environ["MCP_KEY"]
OTHER_KEY = os.environ["MCP_OTHER_KEY"]
TOOLS = {"run_code", "exec", "create_sandbox", "kill_sandbox", "read_file", "write_file", "list_files", "scan_code"}
ID = re.compile(r"sb-[0-9a-f]{16}")


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def http_transport(key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    client = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0, read=300.0))
    return streamable_http_client(f"{URL}/mcp", http_client=client)


def stdio_transport(key):
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "SANDKASTEN_URL": URL}
    if key:
        env["SANDKASTEN_API_KEY"] = key
    params = StdioServerParameters(command=os.environ["SANDKASTEN_BIN"], args=["mcp"], env=env)
    return stdio_client(params)


def text(result):
    return "\n".join(block.text for block in result.content if block.type == "text")


async def call(client, tool, arguments):
    result = await client.call_tool(tool, arguments)
    check(not result.is_error, f"{tool} {arguments} failed: {text(result)}")
    return result


async def refused(transport):
    """A client with this transport cannot even initialize."""
    try:
        async with Client(transport, mode="legacy", read_timeout_seconds=30) as client:
            await client.list_tools()
    except BaseException as error:  # noqa: BLE001 - anyio wraps what the transport raised in exception groups
        return repr(error)
    raise AssertionError("a client without a valid key was served")


async def tools_of_the_session(client):
    listed = await client.list_tools()
    names = {tool.name for tool in listed.tools}
    check(names == TOOLS, f"tools listed: {sorted(names)}")
    for tool in listed.tools:
        check(tool.description and len(tool.description) > 20, f"{tool.name} has no real description")
        check(tool.input_schema.get("type") == "object", f"{tool.name}'s schema: {tool.input_schema}")
    props = {tool.name: tool.input_schema.get("properties", {}) for tool in listed.tools}
    for name, fields in [("run_code", {"language", "code", "sandbox"}), ("create_sandbox", {"isolation", "network",
                         "persist", "template"}), ("write_file", {"sandbox", "path", "content"})]:
        check(fields <= set(props[name]), f"{name}'s schema lacks {fields - set(props[name])}: {props[name]}")


async def every_tool(client):
    """Calls each tool; answers (ids that must end with the session, the persisted id, a t1 id for t2 to try)."""
    ended = []
    # One-shot run_code: its sandbox is killed right after the call.
    result = await call(client, "run_code", {"language": "python", "code": "print('hello from mcp')\n6 * 7"})
    out = text(result)
    check("hello from mcp" in out and "--- result ---\n42" in out, f"one-shot run_code: {out}")
    ended += ID.findall(out)[:1]
    # A named session sandbox keeps its variables.
    await call(client, "run_code", {"language": "python", "code": "x = 41", "sandbox": "main"})
    out = text(await call(client, "run_code", {"language": "python", "code": "x + 1", "sandbox": "main"}))
    check("--- result ---\n42" in out, f"session sandbox lost x: {out}")
    main_id = ID.findall(out)[0]
    ended.append(main_id)
    # A figure comes back as an image.
    figure = "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"
    result = await call(client, "run_code", {"language": "python", "code": figure, "sandbox": "main"})
    images = [block for block in result.content if block.type == "image"]
    check(images and images[0].mime_type == "image/png", f"no PNG in {result.content!r:.300}")
    # A cell that raises reports the error.
    out = text(await call(client, "run_code", {"language": "python", "code": "1 / 0", "sandbox": "main"}))
    check("ZeroDivisionError" in out, f"error not reported: {out}")
    # exec: exit code, stdout, stderr; a timeout names the limit.
    out = text(await call(client, "exec", {"command": "echo out; echo err >&2; exit 3", "sandbox": "main"}))
    check("exit_code: 3" in out and "out\n" in out and "err\n" in out, f"exec: {out}")
    out = text(await call(client, "exec", {"command": "sleep 30", "sandbox": "main", "timeout_ms": 300}))
    check("limit: time" in out, f"exec past its timeout: {out}")
    # create_sandbox with a name and an allowlist; files in it; kill it.
    network = {"mode": "allowlist", "allow": ["example.com:443"]}
    out = text(await call(client, "create_sandbox", {"name": "files", "network": network}))
    files_id = ID.findall(out)[0]
    check("killed when this session ends" in out, f"create_sandbox: {out}")
    await call(client, "write_file", {"sandbox": "files", "path": "/workspace/a.txt", "content": "alpha\n"})
    out = text(await call(client, "read_file", {"sandbox": files_id, "path": "/workspace/a.txt"}))
    check(out == "alpha\n", f"read_file: {out!r}")
    out = text(await call(client, "list_files", {"sandbox": "files"}))
    check("a.txt" in out, f"list_files: {out}")
    out = text(await call(client, "kill_sandbox", {"sandbox": "files"}))
    check(f"sandbox {files_id} killed" in out, f"kill_sandbox: {out}")
    ended.append(files_id)
    result = await client.call_tool("exec", {"command": "true", "sandbox": files_id})
    check(result.is_error and "conflict" in text(result), f"a killed sandbox was usable: {text(result)}")
    # An API error is a tool error with the API's message.
    result = await client.call_tool("read_file", {"sandbox": "main", "path": "/workspace/missing"})
    check(result.is_error and "not_found" in text(result), f"missing file: {text(result)}")
    result = await client.call_tool("create_sandbox", {"isolation": "nonesuch"})
    check(result.is_error and "isolation" in text(result), f"bad isolation accepted: {text(result)}")
    # scan_code: findings with rule and line, no sandbox; benign code has none.
    hostile = "import json\nimport os\nos.system('rm -rf /')\n"
    out = text(await call(client, "scan_code", {"language": "python", "code": hostile}))
    check("process_exec" in out and "at 3:" in out and "verdict: " in out, f"scan_code of a hostile snippet: {out}")
    check(not ID.findall(out), f"scan_code named a sandbox: {out}")
    out = text(await call(client, "scan_code", {"language": "python", "code": "import json\nprint(json.dumps([1]))\n"}))
    check("no findings" in out, f"scan_code flagged benign code: {out}")
    # persist: true outlives the session.
    out = text(await call(client, "create_sandbox", {"persist": True}))
    persisted = ID.findall(out)[0]
    check("persists after this session" in out, f"persist: {out}")
    # A sandbox made with create_sandbox but not killed: the session's end must kill it.
    out = text(await call(client, "create_sandbox", {}))
    ended.append(ID.findall(out)[0])
    return ended, persisted, main_id


async def other_tenant_cannot_touch(transport, victim):
    async with Client(transport, mode="legacy", read_timeout_seconds=60) as client:
        for tool, arguments in [("exec", {"command": "true", "sandbox": victim}),
                                ("read_file", {"sandbox": victim, "path": "/workspace/a.txt"}),
                                ("kill_sandbox", {"sandbox": victim}),
                                ("run_code", {"language": "python", "code": "1", "sandbox": "main"})]:
            result = await client.call_tool(tool, arguments)
            if tool == "run_code":
                # "main" is a name of t1's session: t2's session has its own, new one.
                check(not result.is_error and victim not in text(result), f"t2 reached t1's main: {text(result)}")
            else:
                check(result.is_error and "not_found" in text(result), f"t2 {tool} on {victim}: {text(result)}")
        # t2's own "main" sandbox ends with t2's session.
        return ID.findall(text(result))[:1]


async def once(method, headers, body=None):
    """One request on a connection of its own (a refusal answers before the body is read, and the server then closes
    the connection, so a reused one could be found closed)."""
    async with httpx2.AsyncClient(timeout=30) as http:
        return await http.request(method, f"{URL}/mcp", json=body, headers=headers)


async def session_ids_are_bound_to_their_tenant():
    """A session id used with another tenant's key is unknown there (HTTP only)."""
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    for key in [None, "not-a-key"]:
        headers = {**accept, "Authorization": f"Bearer {key}"} if key else accept
        response = await once("POST", headers, init)
        check(response.status_code == 401, f"key {key}: {response.status_code}")
        check(response.json()["error"]["code"] == "unauthorized", f"key {key}: {response.text}")
        check(response.headers.get("www-authenticate") == "Bearer", f"key {key}: {response.headers}")
    response = await once("POST", {**accept, "Authorization": f"Bearer {KEY}"}, init)
    check(response.status_code == 200, f"initialize: {response.status_code} {response.text}")
    session = response.headers["mcp-session-id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    theirs = {**accept, "Authorization": f"Bearer {OTHER_KEY}", "mcp-session-id": session,
              "mcp-protocol-version": "2025-06-18"}
    response = await once("POST", theirs, listing)
    check(response.status_code == 404, f"t2 with t1's session: {response.status_code} {response.text}")
    check(response.json()["error"]["code"] == "not_found", f"t2 with t1's session: {response.text}")
    response = await once("DELETE", theirs)
    check(response.status_code == 404, f"t2 ended t1's session: {response.status_code}")
    response = await once("DELETE", {**theirs, "Authorization": f"Bearer {KEY}"})
    check(response.status_code == 200, f"t1 could not end its session: {response.status_code}")


async def main(kind):
    transport = {"http": http_transport, "stdio": stdio_transport}[kind]
    print(f"no key: refused ({await refused(transport(None))})")
    print(f"wrong key: refused ({await refused(transport('not-a-key'))})")
    if kind == "http":
        await session_ids_are_bound_to_their_tenant()
        print("session ids bound to their tenant: ok")
    async with Client(transport(KEY), read_timeout_seconds=120) as client:
        await tools_of_the_session(client)
        print("tools listed: ok")
        ended, persisted, main_id = await every_tool(client)
        print("every tool: ok")
        ended += await other_tenant_cannot_touch(transport(OTHER_KEY), main_id)
        print("other tenant: invisible")
    for sandbox in ended:
        print(f"ended {sandbox}")
    print(f"persisted {persisted}")
    print(f"mcp {kind}: ok")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
