"""`sandbox.files` through the sync `e2b.Sandbox`: read as text, bytes and stream, write and write_files, list,
exists, get_info, make_dir, rename, remove, watch_dir, users and relative paths, and NotFound for what is missing.
Each test works in its own directory of the module's sandbox."""

import pytest

import support
from e2b import (
    FileNotFoundException,
    FileType,
    FilesystemEventType,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxException,
)


@pytest.fixture
def home(sbx):
    """A fresh directory under /home/user for one test."""
    path = support.unique("/home/user/files")
    assert sbx.files.make_dir(path) is True
    return path


def test_write_then_read_text(sbx, home):
    info = sbx.files.write(f"{home}/hello.txt", "Grüße aus der Sandbox\n")
    assert info.path == f"{home}/hello.txt"
    assert info.name == "hello.txt"
    assert info.type == FileType.FILE
    assert sbx.files.read(f"{home}/hello.txt") == "Grüße aus der Sandbox\n"
    # Written as the default user, visible to commands, owned by `user`.
    assert sbx.commands.run(f"cat {home}/hello.txt; stat -c %U {home}/hello.txt").stdout.endswith("\nuser\n")


def test_read_bytes_returns_binary_content_unchanged(sbx, home):
    data = bytes(range(256)) * 4
    sbx.files.write(f"{home}/blob.bin", data)
    read = sbx.files.read(f"{home}/blob.bin", format="bytes")
    assert isinstance(read, (bytes, bytearray))
    assert bytes(read) == data


def test_read_stream_yields_the_whole_file_in_chunks(sbx, home):
    sbx.commands.run(f"head -c 3000000 /dev/urandom > {home}/big.bin")
    expected = sbx.commands.run(f"sha256sum {home}/big.bin").stdout.split()[0]
    import hashlib

    digest, total = hashlib.sha256(), 0
    for chunk in sbx.files.read(f"{home}/big.bin", format="stream"):
        digest.update(chunk)
        total += len(chunk)
    assert total == 3_000_000
    assert digest.hexdigest() == expected


def test_write_accepts_bytes_and_file_objects_and_creates_parents(sbx, home):
    import io

    sbx.files.write(f"{home}/a/b/c/deep.txt", b"deep")
    assert sbx.files.read(f"{home}/a/b/c/deep.txt") == "deep"
    sbx.files.write(f"{home}/from-io.txt", io.BytesIO(b"from a file object"))
    assert sbx.files.read(f"{home}/from-io.txt") == "from a file object"
    sbx.files.write(f"{home}/deep.txt", "first")
    sbx.files.write(f"{home}/deep.txt", "second, overwritten")
    assert sbx.files.read(f"{home}/deep.txt") == "second, overwritten"


def test_write_files_writes_several_files(sbx, home):
    infos = sbx.files.write_files(
        [
            {"path": f"{home}/one.txt", "data": "1"},
            {"path": f"{home}/sub/two.txt", "data": b"2"},
        ]
    )
    assert sorted(info.path for info in infos) == [f"{home}/one.txt", f"{home}/sub/two.txt"]
    assert sbx.files.read(f"{home}/one.txt") == "1"
    assert sbx.files.read(f"{home}/sub/two.txt") == "2"


def test_relative_paths_are_relative_to_home(sbx):
    name = support.unique("relative") + ".txt"
    sbx.files.write(name, "relative")
    assert sbx.files.exists(f"/home/user/{name}")
    assert sbx.files.read(f"/home/user/{name}") == "relative"


def test_list_shows_names_types_and_depth(sbx, home):
    sbx.files.write(f"{home}/file.txt", "12345")
    sbx.files.make_dir(f"{home}/dir/inner")
    entries = {entry.name: entry for entry in sbx.files.list(home)}
    assert set(entries) == {"file.txt", "dir"}
    assert entries["file.txt"].type == FileType.FILE
    assert entries["file.txt"].size == 5
    assert entries["file.txt"].path == f"{home}/file.txt"
    assert entries["dir"].type == FileType.DIR
    deep = {entry.path for entry in sbx.files.list(home, depth=2)}
    assert f"{home}/dir/inner" in deep


def test_exists(sbx, home):
    sbx.files.write(f"{home}/here.txt", "x")
    assert sbx.files.exists(f"{home}/here.txt") is True
    assert sbx.files.exists(home) is True
    assert sbx.files.exists(f"{home}/not-here.txt") is False


def test_get_info_describes_a_file_and_a_directory(sbx, home):
    sbx.files.write(f"{home}/info.txt", "four")
    sbx.commands.run(f"chmod 640 {home}/info.txt")
    info = sbx.files.get_info(f"{home}/info.txt")
    assert (info.name, info.path, info.type, info.size) == ("info.txt", f"{home}/info.txt", FileType.FILE, 4)
    assert info.owner == "user"
    assert info.permissions == "-rw-r-----"
    assert info.mode & 0o777 == 0o640
    assert info.modified_time.year >= 2024
    assert sbx.files.get_info(home).type == FileType.DIR


def test_make_dir_reports_whether_it_created(sbx, home):
    assert sbx.files.make_dir(f"{home}/x/y/z") is True
    assert sbx.files.make_dir(f"{home}/x/y/z") is False
    assert sbx.files.get_info(f"{home}/x/y").type == FileType.DIR


def test_rename_moves_a_file(sbx, home):
    sbx.files.write(f"{home}/old.txt", "moving")
    info = sbx.files.rename(f"{home}/old.txt", f"{home}/new.txt")
    assert info.path == f"{home}/new.txt"
    assert sbx.files.exists(f"{home}/old.txt") is False
    assert sbx.files.read(f"{home}/new.txt") == "moving"


def test_remove_deletes_files_and_directories(sbx, home):
    sbx.files.write(f"{home}/gone.txt", "x")
    sbx.files.write(f"{home}/tree/leaf.txt", "x")
    sbx.files.remove(f"{home}/gone.txt")
    sbx.files.remove(f"{home}/tree")
    assert sbx.files.exists(f"{home}/gone.txt") is False
    assert sbx.files.exists(f"{home}/tree") is False


def test_missing_paths_raise_not_found(sbx, home):
    missing = f"{home}/missing.txt"
    with pytest.raises(FileNotFoundException):
        sbx.files.read(missing)
    with pytest.raises(NotFoundException):
        sbx.files.read(missing, format="bytes")
    with pytest.raises(NotFoundException):
        sbx.files.get_info(missing)
    with pytest.raises(NotFoundException):
        sbx.files.list(f"{home}/missing-dir")
    with pytest.raises(NotFoundException):
        sbx.files.rename(missing, f"{home}/elsewhere.txt")


def test_removing_a_missing_path_succeeds_as_envd_s_remove_all_does(sbx, home):
    sbx.files.write(f"{home}/kept.txt", "x")
    assert sbx.files.remove(f"{home}/missing.txt") is None
    assert sbx.files.remove(f"{home}/missing-dir/deeper") is None
    assert [entry.name for entry in sbx.files.list(home)] == ["kept.txt"]


def test_make_dir_of_something_that_is_not_a_directory_is_invalid(sbx, home):
    sbx.files.write(f"{home}/plain.txt", "x")
    with pytest.raises(InvalidArgumentException, match="not a directory"):
        sbx.files.make_dir(f"{home}/plain.txt")
    assert sbx.files.read(f"{home}/plain.txt") == "x"
    # envd's os.Stat follows a link: a link to a directory is a directory that exists.
    sbx.files.make_dir(f"{home}/real")
    sbx.commands.run(f"ln -s real {home}/to-real")
    assert sbx.files.make_dir(f"{home}/to-real") is False


@support.sdk_differs(
    not support.READS_IS_SYMLINK,
    "reports a symlink as its target's type (it predates envd's is_symlink, as with E2B's own envd)",
)
def test_get_info_of_a_symlink_reports_the_link_and_its_resolved_target(sbx, home):
    sbx.files.write(f"{home}/target.txt", "12345")
    sbx.files.make_dir(f"{home}/dir")
    sbx.commands.run(
        f"cd {home} && chmod 640 target.txt && ln -s target.txt link && ln -s link chain && ln -s dir/../dir dirlink"
        " && ln -s nowhere dangling"
    )
    link = sbx.files.get_info(f"{home}/link")
    assert (link.name, link.path, link.type) == ("link", f"{home}/link", FileType.SYMLINK)
    assert link.symlink_target == f"{home}/target.txt"
    assert link.permissions == "Lrwxrwxrwx"
    assert link.mode == 0o640, "the target's mode, as envd reports it"
    assert link.size == len("target.txt"), "the link's own size"
    # A chain resolves to its end; a relative target with .. resolves lexically.
    assert sbx.files.get_info(f"{home}/chain").symlink_target == f"{home}/target.txt"
    assert sbx.files.get_info(f"{home}/dirlink").symlink_target == f"{home}/dir"
    dangling = sbx.files.get_info(f"{home}/dangling")
    assert (dangling.type, dangling.symlink_target, dangling.mode) == (FileType.SYMLINK, f"{home}/dangling", 0)
    assert sbx.files.get_info(f"{home}/target.txt").symlink_target is None


@support.sdk_differs(
    not support.READS_IS_SYMLINK,
    "reports a symlink as its target's type (it predates envd's is_symlink, as with E2B's own envd)",
)
def test_list_walks_depth_first_in_name_order_like_envd(sbx, home):
    for path in ["b.txt", "a/z.txt", "a/inner/deep.txt", "c/.hidden"]:
        sbx.files.write(f"{home}/{path}", "x")
    sbx.commands.run(f"ln -s a {home}/link-to-a")
    relative = lambda entries: [entry.path.removeprefix(home + "/") for entry in entries]  # noqa: E731
    assert relative(sbx.files.list(home)) == ["a", "b.txt", "c", "link-to-a"]
    two_deep = ["a", "a/inner", "a/z.txt", "b.txt", "c", "c/.hidden", "link-to-a"]
    assert relative(sbx.files.list(home, depth=2)) == two_deep
    # Each directory's entries right after it, and never through a symlinked directory.
    assert relative(sbx.files.list(home, depth=3)) == [
        "a", "a/inner", "a/inner/deep.txt", "a/z.txt", "b.txt", "c", "c/.hidden", "link-to-a",
    ]  # fmt: skip
    linked = [entry for entry in sbx.files.list(home) if entry.name == "link-to-a"][0]
    assert (linked.type, linked.symlink_target) == (FileType.SYMLINK, f"{home}/a")
    # Listing through a link lists its directory, under the path asked for.
    assert relative(sbx.files.list(f"{home}/link-to-a")) == ["link-to-a/inner", "link-to-a/z.txt"]
    with pytest.raises(InvalidArgumentException, match="not a directory"):
        sbx.files.list(f"{home}/b.txt")


def test_root_owned_files_are_closed_to_the_default_user(sbx):
    private = support.unique("/tmp/root-only")
    sbx.commands.run(f"mkdir -m 700 {private} && echo secret > {private}/secret.txt", user="root")
    assert sbx.commands.run(f"stat -c %U {private}/secret.txt", user="root").stdout == "root\n"
    assert sbx.files.get_info(private).owner == "root"  # the directory itself can be looked at
    with pytest.raises(SandboxException):
        sbx.files.read(f"{private}/secret.txt")
    with pytest.raises(SandboxException):
        sbx.files.write(f"{private}/intruder.txt", "x")


def test_files_as_root(sbx):
    private = support.unique("/tmp/root-files")
    sbx.commands.run(f"mkdir -m 700 {private}", user="root")
    info = sbx.files.write(f"{private}/by-root.txt", "root only", user="root")
    assert info.path == f"{private}/by-root.txt"
    assert sbx.files.read(f"{private}/by-root.txt", user="root") == "root only"
    assert sbx.files.get_info(f"{private}/by-root.txt", user="root").owner == "root"
    assert [e.name for e in sbx.files.list(private, user="root")] == ["by-root.txt"]
    assert sbx.files.make_dir(f"{private}/sub", user="root") is True
    sbx.files.rename(f"{private}/by-root.txt", f"{private}/sub/moved.txt", user="root")
    assert sbx.files.exists(f"{private}/sub/moved.txt", user="root")
    sbx.files.remove(f"{private}/sub", user="root")
    assert not sbx.files.exists(f"{private}/sub", user="root")
    # Closed to the default user, as a root command's files are.
    with pytest.raises(SandboxException):
        sbx.files.list(private)


def test_root_s_file_operations_hold_no_capability(sbx, home):
    """The sandbox's root is uid 0 without capabilities, as for commands: it cannot write into `user`'s home, read
    a file it may not read, or touch anything outside the sandbox (attacks_sandbox_root.rs checks the host)."""
    sbx.files.write(f"{home}/mine.txt", "user's")
    sbx.commands.run(f"chmod 600 {home}/mine.txt")
    with pytest.raises(SandboxException):
        sbx.files.write(f"{home}/by-root.txt", "x", user="root")
    with pytest.raises(SandboxException):
        sbx.files.read(f"{home}/mine.txt", user="root")
    with pytest.raises(SandboxException):
        sbx.files.write("/usr/bin/planted", "x", user="root")
    with pytest.raises(SandboxException):
        sbx.files.write("/etc/passwd", "root::0:0::/:/bin/sh\n", user="root")
    with pytest.raises(SandboxException) as raised:
        sbx.files.read("/tmp/x", user="nobody")
    assert "not available" in str(raised.value)


def test_watch_dir_reports_created_written_renamed_chmodded_and_removed_files(sbx, home):
    base = support.unique(f"{home}/watched")
    sbx.files.make_dir(base)
    handle = sbx.files.watch_dir(base)
    events = []
    try:
        sbx.files.write(f"{base}/a.txt", "event")
        sbx.commands.run(f"echo more >> {base}/a.txt; chmod 600 {base}/a.txt; mv {base}/a.txt {base}/b.txt")
        sbx.files.remove(f"{base}/b.txt")

        def seen(name, kind):
            def check():
                events.extend(handle.get_new_events())
                return any(e.name == name and e.type == kind for e in events)

            return check

        for name, kind in [("a.txt", FilesystemEventType.CREATE), ("a.txt", FilesystemEventType.WRITE),
                           ("a.txt", FilesystemEventType.CHMOD), ("a.txt", FilesystemEventType.RENAME),
                           ("b.txt", FilesystemEventType.CREATE), ("b.txt", FilesystemEventType.REMOVE)]:
            support.wait_until(seen(name, kind), f"a {kind} event for {name}")
    finally:
        handle.stop()
    with pytest.raises(SandboxException):
        handle.get_new_events()  # stopped


@support.needs_watch_entry()
def test_watch_events_carry_the_entry_when_asked(sbx, home):
    base = support.unique(f"{home}/entries")
    sbx.files.make_dir(base)
    handle = sbx.files.watch_dir(base, include_entry=True)
    events = []
    try:
        sbx.files.write(f"{base}/a.txt", "12345")
        sbx.commands.run(f"mkdir {base}/sub && ln -s a.txt {base}/link && echo gone > {base}/c.txt")
        sbx.files.remove(f"{base}/c.txt")

        def seen():
            events.extend(handle.get_new_events())
            names = {(e.name, e.type) for e in events}
            return {("c.txt", FilesystemEventType.REMOVE), ("link", FilesystemEventType.CREATE)} <= names

        support.wait_until(seen, "the remove of c.txt and the create of link")
    finally:
        handle.stop()
    created = next(e for e in events if e.name == "a.txt" and e.type == FilesystemEventType.CREATE)
    assert created.entry is not None and created.entry.path == f"{base}/a.txt" and created.entry.type == FileType.FILE
    directory = next(e for e in events if e.name == "sub" and e.type == FilesystemEventType.CREATE)
    assert directory.entry is not None and directory.entry.type == FileType.DIR
    link = next(e for e in events if e.name == "link" and e.type == FilesystemEventType.CREATE)
    assert link.entry is not None and link.entry.symlink_target == f"{base}/a.txt"
    removed = next(e for e in events if e.name == "c.txt" and e.type == FilesystemEventType.REMOVE)
    assert removed.entry is None, "a removed entry has no info"
    # Without include_entry, no entry.
    plain = sbx.files.watch_dir(base)
    try:
        sbx.files.write(f"{base}/b.txt", "x")
        later = []
        support.wait_until(lambda: later.extend(plain.get_new_events()) or any(e.name == "b.txt" for e in later),
                           "an event for b.txt")
    finally:
        plain.stop()
    assert all(e.entry is None for e in later), later


def test_a_recursive_watch_follows_new_subdirectories(sbx, home):
    base = support.unique(f"{home}/tree")
    sbx.files.make_dir(f"{base}/old")
    handle = sbx.files.watch_dir(base, recursive=True)
    events = []
    try:
        sbx.files.write(f"{base}/old/deep.txt", "in an existing subdirectory")
        sbx.commands.run(f"mkdir -p {base}/new && echo x > {base}/new/fresh.txt")

        def seen(name):
            def check():
                events.extend(handle.get_new_events())
                return any(e.name == name and e.type == FilesystemEventType.CREATE for e in events)

            return check

        support.wait_until(seen("old/deep.txt"), "a CREATE event for old/deep.txt")
        support.wait_until(seen("new/fresh.txt"), "a CREATE event in a subdirectory made after the watch")
        # Without recursive, nothing below the top level is reported.
        flat = sbx.files.watch_dir(base)
        try:
            sbx.files.write(f"{base}/old/unseen.txt", "below the top")
            sbx.files.write(f"{base}/seen.txt", "at the top")
            flat_events = []

            def top_seen():
                flat_events.extend(flat.get_new_events())
                return any(e.name == "seen.txt" for e in flat_events)

            support.wait_until(top_seen, "a top-level event")
            assert not any("unseen" in e.name for e in flat_events), flat_events
        finally:
            flat.stop()
    finally:
        handle.stop()


def test_a_sandbox_holds_at_most_16_watches():
    # A sandbox of its own: the module's sandbox may hold watches of other tests.
    with support.create(Sandbox) as sandbox:
        base = support.unique("/home/user/many")
        sandbox.files.make_dir(base)
        handles = [sandbox.files.watch_dir(base) for _ in range(16)]
        try:
            with pytest.raises(SandboxException) as refused:
                sandbox.files.watch_dir(base)
            assert "16 watches" in str(refused.value), refused.value
            handles.pop().stop()
            handles.append(sandbox.files.watch_dir(base))  # a stopped watch frees its place
        finally:
            for handle in handles:
                handle.stop()


def test_watching_a_file_or_a_missing_path_fails_as_envd_does(sbx, home):
    sbx.files.write(f"{home}/plain.txt", "not a directory")
    with pytest.raises(SandboxException) as raised:
        sbx.files.watch_dir(f"{home}/plain.txt")
    assert "not a directory" in str(raised.value)
    with pytest.raises(SandboxException):
        sbx.files.watch_dir(f"{home}/{support.unique('missing')}")


def test_a_watch_sees_only_what_the_user_may_read(sbx):
    private = support.unique("/tmp/private-watch")
    sbx.commands.run(f"mkdir -m 700 {private}", user="root")
    with pytest.raises(SandboxException):
        sbx.files.watch_dir(private)


def test_large_streamed_upload(sbx, home):
    import io
    import os as host_os

    data = host_os.urandom(5 * 1024 * 1024)
    info = sbx.files.write(f"{home}/upload.bin", io.BytesIO(data))  # a file object: streamed as octet-stream
    assert info.path == f"{home}/upload.bin"
    assert bytes(sbx.files.read(f"{home}/upload.bin", format="bytes")) == data


def test_gzip_download(sbx, home):
    text = "compressible line\n" * 10_000
    sbx.files.write(f"{home}/gzip.txt", text)
    assert sbx.files.read(f"{home}/gzip.txt", gzip=True) == text
    # On the wire: gzip for a client that takes it (the SDK's httpx unpacks it unseen), the bytes as they are for one
    # that does not.
    import gzip

    import httpx

    url = f"{sbx.download_url(f'{home}/gzip.txt')}&sandbox_id={sbx.sandbox_id}"
    with httpx.stream("GET", url, headers={"Accept-Encoding": "gzip"}) as packed:
        assert packed.status_code == 200 and packed.headers["content-encoding"] == "gzip"
        body = b"".join(packed.iter_raw())
    assert len(body) < len(text) // 10 and gzip.decompress(body).decode() == text
    plain = httpx.get(url, headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.text == text


def test_gzip_upload(sbx, home):
    text = "compressible line\n" * 10_000
    sbx.files.write(f"{home}/gzip-up.txt", text, gzip=True)
    assert sbx.commands.run(f"wc -c < {home}/gzip-up.txt").stdout.strip() == str(len(text))


def test_file_metadata(sbx, home):
    info = sbx.files.write(f"{home}/tagged.txt", "x", metadata={"Origin": "e2b-suite", "run": "1"})
    # Keys are lowercased (they travel as header names), as envd stores them.
    assert info.metadata == {"origin": "e2b-suite", "run": "1"}
    assert sbx.files.get_info(f"{home}/tagged.txt").metadata == {"origin": "e2b-suite", "run": "1"}
    listed = {e.name: e.metadata for e in sbx.files.list(home)}
    assert listed["tagged.txt"] == {"origin": "e2b-suite", "run": "1"}
    # Stored as user.e2b.* extended attributes inside the sandbox (other user.* attributes are not metadata).
    attrs = sbx.commands.run(
        f"/usr/bin/python3 -c \"import os; os.setxattr('{home}/tagged.txt', 'user.other', b'x'); "
        f"print(sorted(os.listxattr('{home}/tagged.txt')))\""
    )
    assert attrs.stdout.strip() == "['user.e2b.origin', 'user.e2b.run', 'user.other']"
    assert sbx.files.get_info(f"{home}/tagged.txt").metadata == {"origin": "e2b-suite", "run": "1"}
    # Kept across a rename.
    moved = sbx.files.rename(f"{home}/tagged.txt", f"{home}/moved.txt")
    assert moved.metadata == {"origin": "e2b-suite", "run": "1"}
    # An overwrite replaces it: with other keys, only those; without any, none.
    sbx.files.write(f"{home}/moved.txt", "y", metadata={"run": "2"})
    assert sbx.files.get_info(f"{home}/moved.txt").metadata == {"run": "2"}
    assert sbx.files.write(f"{home}/moved.txt", "z").metadata is None
    assert sbx.files.get_info(f"{home}/moved.txt").metadata is None
    # write_files gives every file the same metadata; /tmp keeps it too.
    written = sbx.files.write_files(
        [{"path": f"{home}/a.txt", "data": "a"}, {"path": "/tmp/" + support.unique("meta") + ".txt", "data": "b"}],
        metadata={"batch": "yes"},
    )
    assert [w.metadata for w in written] == [{"batch": "yes"}, {"batch": "yes"}]
    assert sbx.files.get_info(written[1].path).metadata == {"batch": "yes"}


def test_file_metadata_out_of_bounds_is_envd_s_error(sbx, home):
    # The SDK checks characters itself; the size bounds are the server's (envd's 246-byte key, 4096 bytes in all).
    with pytest.raises(InvalidArgumentException):
        sbx.files.write(f"{home}/bad.txt", "x", metadata={"bad key": "x"})
    with pytest.raises(InvalidArgumentException, match="exceeds 246 bytes"):
        sbx.files.write(f"{home}/bad.txt", "x", metadata={"k" * 247: "x"})
    with pytest.raises(InvalidArgumentException, match="exceeds 4096 bytes"):
        sbx.files.write(f"{home}/bad.txt", "x", metadata={"k": "v" * 4096})
    assert not sbx.files.exists(f"{home}/bad.txt")


def test_signed_download_and_upload_urls(sbx, home):
    """download_url/upload_url: what the SDK signs with the access token. The URL alone (no headers) works where it
    names the sandbox: at E2B's host name `49983-ID.DOMAIN` (the SDK's URL without E2B_SANDBOX_URL; here the server's
    address with that Host, as a wildcard DNS record would send it) or with `&sandbox_id=`; the SDK's URL with
    E2B_SANDBOX_URL names none and is refused rather than checked against every sandbox's token."""
    import time

    import httpx

    envd_host = {"Host": f"49983-{sbx.sandbox_id}.{sbx.sandbox_domain}"}

    def by_id(url: str) -> str:
        return f"{url}&sandbox_id={sbx.sandbox_id}"

    sbx.files.write(f"{home}/shared.txt", "signed")
    url = sbx.download_url(f"{home}/shared.txt")
    assert "signature=v1_" in url
    assert httpx.get(url, headers=envd_host).text == "signed"
    assert httpx.get(by_id(url)).text == "signed"
    unnamed = httpx.get(url)
    assert unnamed.status_code == 401 and "names no sandbox" in unnamed.json()["message"]
    timed = sbx.download_url(f"{home}/shared.txt", use_signature_expiration=60)
    assert "signature_expiration=" in timed and httpx.get(timed, headers=envd_host).text == "signed"
    upload = sbx.upload_url(f"{home}/uploaded.txt")
    assert httpx.post(upload, headers=envd_host, files={"file": ("uploaded.txt", b"sent by url")}).status_code == 200
    assert sbx.files.read(f"{home}/uploaded.txt") == "sent by url"
    # Expired, tampered, missing, or a download's signature used to upload: 401.
    expired = sbx.download_url(f"{home}/shared.txt", use_signature_expiration=-10)
    assert int(expired.split("signature_expiration=")[1].split("&")[0]) < time.time()
    refused = httpx.get(expired, headers=envd_host)
    assert refused.status_code == 401 and "expired" in refused.json()["message"]
    tampered = url.replace("signature=v1_", "signature=v1_x")
    assert httpx.get(tampered, headers=envd_host).status_code == 401
    assert httpx.get(by_id(tampered)).status_code == 401
    assert httpx.get(url.split("&signature=")[0], headers=envd_host).status_code == 401
    assert httpx.get(url.replace("shared.txt", "other.txt"), headers=envd_host).status_code == 401
    as_upload = url.replace("shared.txt", "uploaded.txt")
    assert httpx.post(as_upload, headers=envd_host, files={"file": ("u", b"x")}).status_code == 401
    assert sbx.files.read(f"{home}/uploaded.txt") == "sent by url"
    # Another sandbox's name with this one's signature: its own token does not make it.
    other = support.create(Sandbox)
    try:
        misnamed = httpx.get(url, headers={"Host": f"49983-{other.sandbox_id}.{sbx.sandbox_domain}"})
        assert misnamed.status_code == 401 and "invalid signature" in misnamed.json()["message"]
    finally:
        other.kill()
    # As root: the user is part of what is signed.
    private = support.unique("/tmp/root-url")
    sbx.commands.run(f"mkdir -m 700 {private} && echo hidden > {private}/f", user="root")
    assert httpx.get(sbx.download_url(f"{private}/f", user="root"), headers=envd_host).text == "hidden\n"
    assert httpx.get(sbx.download_url(f"{private}/f"), headers=envd_host).status_code != 200