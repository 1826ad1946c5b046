"""The installed package is typed: it ships `py.typed`, passes `mypy --strict` against httpx's own types, and type-
checks for Python 3.9, its oldest supported version (without site-packages there, since the pinned httpx stack uses
newer syntax; httpx's types come from the first check). Needs no server."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List

import sandkasten

PACKAGE = os.path.dirname(os.path.realpath(sandkasten.__file__))


def mypy(*flags: str) -> subprocess.CompletedProcess[str]:
    command: List[str] = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--no-incremental",
        "--cache-dir",
        os.devnull,
        *flags,
        PACKAGE,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_the_package_ships_its_typing_marker() -> None:
    assert os.path.isfile(os.path.join(PACKAGE, "py.typed"))


def test_mypy_strict_passes() -> None:
    result = mypy()
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_passes_for_python_3_9() -> None:
    result = mypy("--python-version", "3.9", "--no-site-packages", "--ignore-missing-imports")
    assert result.returncode == 0, result.stdout + result.stderr
