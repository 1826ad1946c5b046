"""`get_metrics()` through the sync `e2b.Sandbox`, instance and class forms: samples of what the sandbox uses now
(memory held by a process it runs, the disk a file it wrote takes, its CPU count and limits), filtered by `start`, and
SandboxNotFoundException for a sandbox that is not there."""

import datetime

import pytest

from e2b import Sandbox, SandboxNotFoundException


def test_metrics_show_what_the_sandbox_holds(sbx):
    # 40 MiB written to the home, and a Python process holding 64 MiB of touched memory while the metrics are read.
    sbx.commands.run("head -c 41943040 /dev/zero > /home/user/metrics-blob")
    holder = sbx.commands.run(
        "/usr/bin/python3 -c 'import time; b = bytearray(64 << 20); open(\"/tmp/held\", \"w\").close(); "
        "time.sleep(60)'",
        background=True,
    )
    try:
        sbx.commands.run("for i in $(seq 300); do [ -e /tmp/held ] && exit 0; sleep 0.1; done; exit 1")
        metrics = sbx.get_metrics()
        assert metrics, "no samples"
        latest = metrics[-1]
        assert latest.cpu_count >= 1
        assert latest.mem_total > 0
        assert latest.mem_used >= 64 << 20, latest
        assert latest.disk_used >= 40 << 20, latest
        assert latest.disk_total >= latest.disk_used, latest
        assert 0.0 <= latest.cpu_used_pct <= 100.0, latest
        assert isinstance(latest.timestamp, datetime.datetime)

        same = Sandbox.get_metrics(sbx.sandbox_id)
        assert same and same[-1].disk_used >= 40 << 20
        future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
        assert sbx.get_metrics(start=future) == []
    finally:
        holder.kill()
        sbx.commands.run("rm -f /home/user/metrics-blob")


def test_metrics_of_an_unknown_sandbox_raise_not_found():
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics("sb-0123456789abcdef")
