"""Request bodies shared by the sync and async clients (create, exec, run, code), and the tar archives of
`files.upload_dir` / `files.download_dir`: packing a local directory (regular files and directories only, as the
server accepts) and unpacking a download without letting a member escape the target directory."""

from __future__ import annotations

import base64
import io
import os
import tarfile
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

from .models import LimitsLike, NetworkLike, limits_json, network_json

Json = Dict[str, Any]
#: A command: a shell line (run with /bin/bash -c) or an argv list.
Command = Union[str, Sequence[str]]


def create_body(
    *,
    isolation: Optional[str] = None,
    template: Optional[str] = None,
    limits: Optional[LimitsLike] = None,
    network: Optional[NetworkLike] = None,
    env: Optional[Mapping[str, str]] = None,
    metadata: Optional[Mapping[str, str]] = None,
    timeout: Optional[int] = None,
    secrets: Optional[Sequence[str]] = None,
    snapshot: Optional[str] = None,
    auto_pause: bool = False,
    auto_resume: bool = False,
    pause_mode: str = "memory",
) -> Json:
    body: Json = {}
    if isolation is not None:
        body["isolation"] = isolation
    if template is not None:
        body["template"] = template
    if limits is not None:
        body["limits"] = limits_json(limits)
    if network is not None:
        body["network"] = network_json(network)
    if env:
        body["env"] = dict(env)
    if metadata:
        body["metadata"] = dict(metadata)
    if timeout is not None:
        body["timeout_s"] = int(timeout)
    if secrets:
        body["secrets"] = list(secrets)
    if snapshot is not None:
        body["snapshot"] = snapshot
    if auto_pause or auto_resume or pause_mode != "memory":
        body["lifecycle"] = {"auto_pause": auto_pause, "auto_resume": auto_resume, "pause_mode": pause_mode}
    return body


def command_fields(command: Command) -> Json:
    if isinstance(command, str):
        return {"cmd": command}
    argv = list(command)
    if not argv or not all(isinstance(arg, str) for arg in argv):
        raise ValueError("a command is a shell line (str) or a non-empty list of str")
    return {"argv": argv}


def template_build_body(
    spec: Union[str, Mapping[str, Any], None],
    dockerfile: Optional[str],
    name: Optional[str],
    files: Optional[Mapping[str, Union[str, bytes]]],
) -> Json:
    """`POST /v1/templates`: the spec (template.toml text or its fields) or a Dockerfile, and the files it copies."""
    body: Json = {}
    if spec is not None:
        body["spec"] = spec if isinstance(spec, str) else dict(spec)
    if dockerfile is not None:
        body["dockerfile"] = dockerfile
    if name is not None:
        body["name"] = name
    if files:
        body["files"] = {
            src: base64.b64encode(data.encode("utf-8") if isinstance(data, str) else data).decode("ascii")
            for src, data in files.items()
        }
    return body


def seconds_to_ms(seconds: Optional[float]) -> Optional[int]:
    return None if seconds is None else max(1, int(seconds * 1000))


def exec_body(
    command: Command,
    *,
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    stdin: Optional[str],
    timeout: Optional[float],
    background: bool,
    pty: Optional[Tuple[int, int]] = None,
) -> Json:
    body = command_fields(command)
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    if stdin is not None:
        body["stdin"] = stdin
    if timeout is not None:
        body["timeout_ms"] = seconds_to_ms(timeout)
    if background:
        body["background"] = True
    if pty is not None:
        cols, rows = pty
        body["pty"] = {"cols": cols, "rows": rows}
    return body


def run_body(
    *,
    code: Optional[str],
    language: Optional[str],
    command: Optional[Command],
    files: Optional[Mapping[str, Union[str, bytes]]],
    env: Optional[Mapping[str, str]],
    stdin: Optional[str],
    isolation: Optional[str],
    limits: Optional[LimitsLike],
    network: Optional[NetworkLike],
) -> Json:
    if (code is None) == (command is None):
        raise ValueError("run needs exactly one of code= (with language=) and command=")
    body: Json = command_fields(command) if command is not None else {"code": code}
    if language is not None:
        body["language"] = language
    if files:
        body["files"] = [_run_file(path, content) for path, content in files.items()]
    if env:
        body["env"] = dict(env)
    if stdin is not None:
        body["stdin"] = stdin
    if isolation is not None:
        body["isolation"] = isolation
    if limits is not None:
        body["limits"] = limits_json(limits)
    if network is not None:
        body["network"] = network_json(network)
    return body


def _run_file(path: str, content: Union[str, bytes]) -> Json:
    if isinstance(content, str):
        return {"path": path, "content": content}
    return {"path": path, "content_base64": base64.b64encode(content).decode("ascii")}


def code_body(code: str, language: Optional[str], context: Optional[str], timeout: Optional[float]) -> Json:
    body: Json = {"code": code}
    if language is not None:
        body["language"] = language
    if context is not None:
        body["context_id"] = context
    if timeout is not None:
        body["timeout_ms"] = seconds_to_ms(timeout)
    return body


def pack_dir(local_dir: Union[str, "os.PathLike[str]"]) -> bytes:
    """A plain tar of the directory's regular files and directories, names relative to it (symlinks are refused)."""
    root = os.fspath(local_dir)
    if not os.path.isdir(root):
        raise NotADirectoryError(f"upload_dir needs a local directory: {root}")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for parent, dirs, names in os.walk(root):
            dirs.sort()
            for name in sorted(dirs) + sorted(names):
                full = os.path.join(parent, name)
                relative = os.path.relpath(full, root)
                if os.path.islink(full):
                    raise ValueError(f"upload_dir cannot send symlinks (the server refuses them): {full}")
                if os.path.isdir(full) or os.path.isfile(full):
                    archive.add(full, arcname=relative, recursive=False)
                else:
                    raise ValueError(f"upload_dir sends regular files and directories only: {full}")
    return buffer.getvalue()


def unpack_into(data: bytes, local_dir: Union[str, "os.PathLike[str]"]) -> None:
    """Unpacks a downloaded tar under `local_dir`; a member that would land outside it, or a device, is refused."""
    root = os.path.realpath(os.fspath(local_dir))
    os.makedirs(root, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        members = archive.getmembers()
        for member in members:
            target = os.path.realpath(os.path.join(root, member.name))
            if os.path.commonpath([root, target]) != root:
                raise ValueError(f"archive member escapes the target directory: {member.name}")
            if not (member.isfile() or member.isdir() or member.issym()):
                raise ValueError(f"archive member is neither file, directory nor symlink: {member.name}")
            if member.issym() and os.path.isabs(member.linkname):
                continue  # an absolute link points into the sandbox, not here: left out
        for member in members:
            if member.issym() and os.path.isabs(member.linkname):
                continue
            member.mode = (member.mode | 0o600) & 0o777 if member.isfile() else 0o755
            # Python's own checks as well, where it has them (3.12, and backported to later 3.9/3.10/3.11 releases).
            safety: Dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extract(member, root, set_attrs=False, **safety)
