"""Files through the sync Sandbox: bytes and text both ways, list/stat/mkdir/rename/remove, errors for missing paths,
and whole directories up and down as tar archives (round trip of a nested tree)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandkasten import NotFound, Sandbox


def test_write_read_list_stat(sbx: Sandbox) -> None:
    sbx.files.mkdir("/workspace/notes", parents=True)
    sbx.files.write("/workspace/notes/a.txt", "hello")
    sbx.files.write("/workspace/notes/b.bin", bytes(range(256)))
    assert sbx.files.read_text("/workspace/notes/a.txt") == "hello"
    assert sbx.files.read("/workspace/notes/b.bin") == bytes(range(256))
    entries = {entry.name: entry for entry in sbx.files.list("/workspace/notes")}
    assert set(entries) == {"a.txt", "b.bin"} and entries["b.bin"].size == 256
    info = sbx.files.stat("/workspace/notes")
    assert info.is_dir and info.path == "/workspace/notes"
    # The command sees what the API wrote.
    assert sbx.exec("cat /workspace/notes/a.txt").stdout == "hello"


def test_rename_and_remove(sbx: Sandbox) -> None:
    sbx.files.write("/workspace/old.txt", "x")
    sbx.files.rename("/workspace/old.txt", "/workspace/new.txt")
    assert sbx.files.read("/workspace/new.txt") == b"x"
    with pytest.raises(NotFound):
        sbx.files.stat("/workspace/old.txt")
    sbx.files.remove("/workspace/new.txt")
    sbx.files.mkdir("/workspace/tree/deep", parents=True)
    sbx.files.remove("/workspace/tree", recursive=True)
    with pytest.raises(NotFound) as caught:
        sbx.files.read("/workspace/tree/deep")
    assert caught.value.message


def test_upload_and_download_a_directory(sbx: Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "sub" / "deeper").mkdir(parents=True)
    (source / "top.txt").write_text("top")
    (source / "sub" / "deeper" / "data.bin").write_bytes(b"\x00" * 1000)
    summary = sbx.files.upload_dir(source, "/workspace/project")
    assert (summary.files, summary.bytes) == (2, 1003)
    assert (
        sbx.exec("cat /workspace/project/top.txt; wc -c < /workspace/project/sub/deeper/data.bin").stdout == "top1000\n"
    )
    target = tmp_path / "copy"
    sbx.files.download_dir("/workspace/project", target)
    assert (target / "top.txt").read_text() == "top"
    assert (target / "sub" / "deeper" / "data.bin").read_bytes() == b"\x00" * 1000
    assert sorted(os.listdir(target)) == ["sub", "top.txt"]
