"""`sandbox.files` (sync): read, write, list, stat, mkdir, rename and remove paths inside a sandbox, and move whole
directories in and out as tar archives (`upload_dir`, `download_dir`). Paths are absolute paths inside the sandbox
(`/workspace/...`, `/home/user/...`). The async twin is in aio_files.py."""

from __future__ import annotations

import os
from typing import List, Union

from . import _bodies
from ._http import Transport, json_of
from ._operations import op, uses
from .models import ArchiveSummary, FileInfo

LocalPath = Union[str, "os.PathLike[str]"]


class Files:
    """The files of one sandbox."""

    def __init__(self, transport: Transport, sandbox_id: str) -> None:
        self._transport = transport
        self._path = {"id": sandbox_id}

    @uses("files.read")
    def read(self, path: str) -> bytes:
        """The file's bytes."""
        content: bytes = self._transport.request(op("files.read"), self._path, params={"path": path}).content
        return content

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    @uses("files.write")
    def write(self, path: str, data: Union[bytes, str]) -> None:
        """Creates or replaces the file (text is written as UTF-8)."""
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        headers = {"Content-Type": "application/octet-stream"}
        self._transport.request(op("files.write"), self._path, params={"path": path}, content=content, headers=headers)

    @uses("files.list")
    def list(self, path: str = "/workspace") -> List[FileInfo]:
        """The directory's entries (not recursive)."""
        response = self._transport.request(op("files.list"), self._path, params={"path": path})
        return [FileInfo.from_json(item) for item in json_of(response).get("entries", [])]

    @uses("files.stat")
    def stat(self, path: str) -> FileInfo:
        """Describes the path (a final symlink is not followed); NotFound when it does not exist."""
        return FileInfo.from_json(json_of(self._transport.request(op("files.stat"), self._path, params={"path": path})))

    @uses("files.mkdir")
    def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Creates a directory (`parents=True`: missing parents too, and an existing directory is fine)."""
        self._transport.request(op("files.mkdir"), self._path, json={"path": path, "parents": parents})

    @uses("files.rename")
    def rename(self, source: str, destination: str) -> None:
        """Moves `source` to `destination`."""
        self._transport.request(op("files.rename"), self._path, json={"from": source, "to": destination})

    @uses("files.remove")
    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, or a directory (non-empty ones need `recursive=True`)."""
        params = {"path": path, "recursive": recursive or None}
        self._transport.request(op("files.remove"), self._path, params=params)

    @uses("files.upload_dir")
    def upload_dir(self, local_dir: LocalPath, remote_dir: str) -> ArchiveSummary:
        """Copies a local directory's files and subdirectories into `remote_dir` (created when missing)."""
        headers = {"Content-Type": "application/x-tar"}
        response = self._transport.request(
            op("files.upload_dir"),
            self._path,
            params={"path": remote_dir},
            content=_bodies.pack_dir(local_dir),
            headers=headers,
            long=True,
        )
        return ArchiveSummary.from_json(json_of(response))

    @uses("files.download_dir")
    def download_dir(self, remote_dir: str, local_dir: LocalPath) -> None:
        """Copies the sandbox directory `remote_dir` (its contents) into the local directory `local_dir`."""
        response = self._transport.request(op("files.download_dir"), self._path, params={"path": remote_dir}, long=True)
        _bodies.unpack_into(response.content, local_dir)
