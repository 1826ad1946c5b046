"""A secret made with E2B's `Secret` API, named in `network.rules`, set as a header toward its host: run by
crates/cli/tests/e2b_sdk.rs (`e2b_secrets_are_set_as_headers_toward_a_test_host`) against a server whose egress proxy
reaches test hosts in network namespaces; the Rust test reads the host's request log, so what arrived is checked on
the host's side. Not part of the default suite (its name is no `test_*.py`): it needs those hosts.

E2B_SUITE_HEADER_HOST names the HTTPS test host; E2B_SUITE_SECRET_VALUE and E2B_SUITE_ROTATED_VALUE are the values
the Rust test looks for in the requests `/e2b-rule-sync`, `/e2b-rule-rotated`, `/e2b-rule-async`; after the secret is
destroyed `/e2b-rule-deleted` must carry neither."""

import os

import pytest

import support
from e2b import AsyncSandbox, AsyncSecret, Sandbox, Secret

HOST = os.environ.get("E2B_SUITE_HEADER_HOST", "")
VALUE = os.environ.get("E2B_SUITE_SECRET_VALUE", "")
ROTATED = os.environ.get("E2B_SUITE_ROTATED_VALUE", "")

pytestmark = pytest.mark.skipif(not (HOST and VALUE and ROTATED), reason="needs the test hosts of e2b_sdk.rs")


def _network(name: str) -> dict:
    rule = {"transform": {"headers": {"Authorization": f"Bearer {Secret.fill(name)}"}}}
    return {"deny_out": ["0.0.0.0/0"], "allow_out": [HOST], "rules": {HOST: [rule]}}


def _curl(path: str) -> str:
    return f"curl -sS -m 10 -H 'Authorization: Bearer chosen-inside' https://{HOST}{path}"


def test_a_created_secret_reaches_its_host_in_a_header_and_rotation_and_destroy_apply_live():
    name = support.unique("header-secret")
    Secret.create(name, VALUE)
    destroyed = False
    try:
        with support.create(Sandbox, network=_network(name)) as sandbox:
            sandbox.commands.run(_curl("/e2b-rule-sync"))
            assert VALUE not in sandbox.commands.run("cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'").stdout
            Secret.update(name, ROTATED)
            sandbox.commands.run(_curl("/e2b-rule-rotated"))
            destroyed = Secret.destroy(name)
            assert destroyed
            # Nothing intercepts the host any more for this rule; whatever arrives carries no value.
            sandbox.commands.run(_curl("/e2b-rule-deleted") + " || true")
    finally:
        if not destroyed:
            Secret.destroy(name)


@pytest.mark.asyncio
async def test_an_async_created_secret_reaches_its_host_in_a_header():
    name = support.unique("async-header-secret")
    await AsyncSecret.create(name, VALUE)
    try:
        sandbox = await support.acreate(AsyncSandbox, network=_network(name))
        try:
            await sandbox.commands.run(_curl("/e2b-rule-async"))
        finally:
            await sandbox.kill()
    finally:
        await AsyncSecret.destroy(name)
