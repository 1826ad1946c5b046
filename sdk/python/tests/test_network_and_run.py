"""Network policy changes and the egress audit, secrets, the static scan, and the one-shot run (code in each language,
a command, streamed output, a compile error)."""

from __future__ import annotations

from typing import List

import pytest

from sandkasten import BadRequest, Client, HeaderRule, NetworkPolicy, Sandbox


def test_policy_change_and_egress_audit(sbx: Sandbox) -> None:
    policy = sbx.set_network(NetworkPolicy.allowlist("allowed.example"))
    assert policy.mode == "allowlist" and policy.allow == ["allowed.example"]
    sbx.exec("curl -s -m 5 -o /dev/null http://refused.example/ || true")
    events = sbx.egress()
    refused = [event for event in events if event.host == "refused.example"]
    assert refused and refused[0].decision == "refused" and refused[0].rule
    assert len(sbx.egress(limit=1)) == 1
    assert sbx.set_network("none").mode == "none"


def test_secrets_put_list_delete(client: Client) -> None:
    secret = client.secrets.put("SDK_SUITE_TOKEN", "s3cr3t", ["api.example.com"])
    assert secret.name == "SDK_SUITE_TOKEN" and secret.hosts == ["api.example.com"]
    assert secret.id.startswith("sec_") and secret.version == 1 and secret.metadata == {}
    assert client.secrets.get(secret.id).name == "SDK_SUITE_TOKEN"
    assert "SDK_SUITE_TOKEN" in {listed.name for listed in client.secrets.list()}
    client.secrets.delete("SDK_SUITE_TOKEN")
    assert "SDK_SUITE_TOKEN" not in {listed.name for listed in client.secrets.list()}


def test_header_rules_read_back_with_their_placeholder_and_an_unknown_secret_is_named(client: Client) -> None:
    client.secrets.put("SDK_RULE_TOKEN", "rule-s3cr3t", ["api.example.com"])
    rule = HeaderRule("api.example.com", "Authorization", "Bearer ${secrets.SDK_RULE_TOKEN}")
    policy = NetworkPolicy(mode="allowlist", allow=["api.example.com"], headers=[rule])
    sbx = client.create_sandbox(network=policy)
    try:
        assert sbx.refresh().network.headers == [rule]
        assert sbx.set_network(policy).headers == [rule]
        with pytest.raises(BadRequest, match="NOPE"):
            sbx.set_network(NetworkPolicy(mode="allowlist", allow=["api.example.com"],
                                          headers=[HeaderRule("api.example.com", "X", "${secrets.NOPE}")]))
    finally:
        sbx.kill()
        client.secrets.delete("SDK_RULE_TOKEN")


def test_scan_names_rule_and_line_and_refuses_a_loosening_policy(client: Client) -> None:
    report = client.scan("import os\nos.system('rm -rf /')\n", "python")
    rules = {(finding.rule, finding.line) for finding in report.findings}
    assert ("process_exec", 2) in rules and report.verdict in {"allow", "warn", "block"}, report
    assert client.scan("print(1)\n", "python").findings == []
    tightened = client.scan("import os\nos.system('rm -rf /')\n", "python", policy={"mode": "enforce"})
    assert tightened.verdict == "block", tightened


def test_one_shot_runs(client: Client) -> None:
    python = client.run("print(6 * 7)", "python")
    assert python.stdout == "42\n" and python.exit_code == 0 and python.error_code is None
    command = client.run(command=["sh", "-c", "cat input.txt; exit 2"], files={"input.txt": "given"})
    assert command.stdout == "given" and command.exit_code == 2
    out: List[str] = []
    streamed = client.run("for i in 1 2; do echo $i; done", "bash", on_stdout=out.append)
    assert "".join(out) == "1\n2\n" == streamed.stdout
    broken = client.run("int main( {", "c")
    assert broken.error_code == "compile_error" and broken.error_message
