"""E2B's secrets API through the sync and async `e2b` SDK (`Secret` / `AsyncSecret`): create, get_info, exists,
update, list with paging, destroy, the errors E2B gives for bad input, and a created secret named by `network.rules`
(`Secret.fill(name)`, i.e. `${e2b.secrets.NAME}`): the sandbox gets the rule with its placeholder, never the value.
That the header reaches its host is `secret_headers.py`'s part (crates/cli/tests/e2b_sdk.rs runs it with test hosts).
Values are never returned by any read."""

import pytest

import support

try:
    from e2b import AsyncSecret, Secret, SecretException, SecretNotFoundException
except ImportError:  # SDKs before the secrets API
    Secret = AsyncSecret = SecretException = SecretNotFoundException = None

needs_secrets = pytest.mark.skipif(Secret is None, reason="no Secret API in this SDK")


def _name(prefix: str) -> str:
    return support.unique(f"{prefix}-{support.RUN_ID}")


@needs_secrets
def test_secrets_are_created_read_updated_listed_and_destroyed():
    name = _name("Suite-Key")
    made = Secret.create(name, "sk-value-one", metadata={"team": "agents"})
    assert made.name == name.lower(), "names are stored lowercased"
    assert made.secret_id.startswith("sec_") and made.version == 1
    assert made.metadata == {"team": "agents"} and made.created_at == made.updated_at
    for key in (made.secret_id, made.name, name):
        info = Secret.get_info(key)
        assert (info.secret_id, info.version) == (made.secret_id, 1), key
    assert "sk-value-one" not in repr(Secret.get_info(made.secret_id))
    assert Secret.exists(made.name) and not Secret.exists(_name("missing"))
    updated = Secret.update(made.name, "sk-value-two")
    assert (updated.version, updated.metadata) == (2, {"team": "agents"}), "metadata kept unless given"
    updated = Secret.update(made.secret_id, "sk-value-three", metadata={"team": "other"})
    assert (updated.version, updated.metadata) == (3, {"team": "other"})
    assert updated.updated_at >= made.updated_at
    assert Secret.destroy(made.secret_id) is True
    assert Secret.destroy(made.secret_id) is False, "a destroyed secret is not found"
    with pytest.raises(SecretNotFoundException):
        Secret.get_info(made.secret_id)
    with pytest.raises(SecretNotFoundException):
        Secret.update(made.name, "x")


@needs_secrets
def test_secret_list_pages_newest_first_without_values():
    names = [_name(f"paged-{n}") for n in range(5)]
    made = [Secret.create(name, f"value-of-{name}") for name in names]
    try:
        paginator = Secret.list(limit=2)
        seen = []
        for _ in range(200):  # bounded: other tests' secrets may be listed too
            if not paginator.has_next:
                break
            page = paginator.next_items()
            assert len(page) <= 2
            seen.extend(page)
        ours = [info.secret_id for info in seen if info.name in names]
        assert sorted(ours) == sorted(m.secret_id for m in made), "each of ours exactly once"
        assert ours[0] == made[-1].secret_id, "newest first"
        assert not any("value-of-" in repr(info) for info in seen)
    finally:
        for secret in made:
            Secret.destroy(secret.secret_id)


@needs_secrets
def test_bad_secret_input_gets_e2b_s_errors():
    name = _name("taken")
    Secret.create(name, "v")
    try:
        with pytest.raises(SecretException, match="already exists"):
            Secret.create(name, "again")
        with pytest.raises(SecretException, match="invalid"):
            Secret.create("has space", "v")
        with pytest.raises(SecretException, match="reserved"):
            Secret.create("sec_mine", "v")
        with pytest.raises(SecretException, match="1 to 8192 bytes"):
            Secret.create(_name("empty"), "")
        with pytest.raises(SecretException, match="entries"):
            Secret.create(_name("meta"), "v", metadata={f"k{n}": "v" for n in range(33)})
        assert Secret.get_info(name).version == 1, "refused writes change nothing"
    finally:
        Secret.destroy(name)


@needs_secrets
def test_a_created_secret_is_what_network_rules_resolve():
    from e2b import Sandbox

    name = _name("rule-key")
    value = f"rule-value-{support.RUN_ID}"
    Secret.create(name, value)
    try:
        placeholder = Secret.fill(name)
        network = {
            "deny_out": ["0.0.0.0/0"],
            "allow_out": ["api.example.com"],
            "rules": {"api.example.com": [{"transform": {"headers": {"Authorization": f"Bearer {placeholder}"}}}]},
        }
        with support.create(Sandbox, network=network) as sandbox:
            info = repr(sandbox.get_info())
            assert value not in info, "the value in get_info"
            assert placeholder in info, f"get_info shows the rule with its placeholder: {info}"
            inside = sandbox.commands.run("env; cat /proc/self/environ | tr '\\0' '\\n'")
            assert value not in inside.stdout, "the value inside the sandbox"
        # A rule naming a secret that does not exist is refused at create.
        missing = dict(network, rules={"api.example.com": [{"transform": {"headers": {"X": Secret.fill(_name("no"))}}}]})
        with pytest.raises(Exception, match="does not exist"):
            support.create(Sandbox, network=missing)
    finally:
        Secret.destroy(name)


@needs_secrets
@pytest.mark.asyncio
async def test_async_secrets_are_created_read_updated_listed_and_destroyed():
    name = _name("async-key")
    made = await AsyncSecret.create(name, "async-value-one", metadata={"kind": "async"})
    try:
        assert made.name == name and made.version == 1
        assert (await AsyncSecret.get_info(name)).secret_id == made.secret_id
        assert await AsyncSecret.exists(made.secret_id)
        updated = await AsyncSecret.update(name, "async-value-two", metadata={})
        assert (updated.version, updated.metadata) == (2, {})
        paginator = AsyncSecret.list(limit=1)
        found = []
        for _ in range(200):
            if not paginator.has_next:
                break
            found.extend(info.secret_id for info in await paginator.next_items())
        assert found.count(made.secret_id) == 1
        with pytest.raises(SecretNotFoundException):
            await AsyncSecret.get_info(_name("missing"))
        with pytest.raises(SecretException, match="invalid"):
            await AsyncSecret.create("bad name", "v")
    finally:
        assert await AsyncSecret.destroy(made.secret_id) is True
    assert await AsyncSecret.destroy(made.secret_id) is False
