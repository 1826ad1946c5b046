//! File requests in serve mode: chunked reads and writes, listing, stat, mkdir, rename, remove; and the attacks on
//! path resolution (`..`, symlinks out of the root) and on the agent's privileges.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sandkasten_protocol::Message;
use sandkasten_types::{FailureKind, FileKind};

use super::{TestAgent, test_identity};

fn write(path: &str, data: &[u8], append: bool, mode: Option<u32>) -> Message {
    Message::FileWrite { path: path.into(), data: STANDARD.encode(data), append, mode }
}

fn read(agent: &mut TestAgent, path: &str, offset: u64, len: u64) -> Result<(Vec<u8>, bool), FailureKind> {
    match agent.request(1, Message::FileRead { path: path.into(), offset, len }) {
        Message::FileData { data, eof } => Ok((STANDARD.decode(data).unwrap(), eof)),
        Message::Failed(failure) => Err(failure.kind),
        other => panic!("{other:?}"),
    }
}

fn code(msg: Message) -> Option<FailureKind> {
    match msg {
        Message::Done => None,
        Message::Failed(failure) => Some(failure.kind),
        other => panic!("{other:?}"),
    }
}

#[test]
fn chunked_write_append_read_and_mode() {
    let mut agent = TestAgent::start();
    assert_eq!(code(agent.request(1, write("/workspace/a.txt", b"hello", false, Some(0o600)))), None);
    assert_eq!(code(agent.request(1, write("/workspace/a.txt", b" world", true, None))), None);
    assert_eq!(read(&mut agent, "/workspace/a.txt", 0, 3), Ok((b"hel".to_vec(), false)));
    assert_eq!(read(&mut agent, "/workspace/a.txt", 6, 100), Ok((b"world".to_vec(), true)));
    let meta = std::fs::metadata(agent.host_path("/workspace/a.txt")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    if let Some(identity) = test_identity() {
        assert_eq!((meta.uid(), meta.gid()), (identity.uid, identity.gid), "written as the sandbox user");
    }
    // Without append the file is truncated.
    agent.request(1, write("/workspace/a.txt", b"new", false, None));
    assert_eq!(read(&mut agent, "/workspace/a.txt", 0, 100), Ok((b"new".to_vec(), true)));
    agent.shutdown();
}

#[test]
fn reads_are_capped_at_one_mib_per_reply() {
    let mut agent = TestAgent::start();
    let content: Vec<u8> = (0..(3 << 19)).map(|i: u32| (i % 251) as u8).collect();
    agent.request(1, write("/workspace/big", &content[..1 << 20], false, None));
    agent.request(1, write("/workspace/big", &content[1 << 20..], true, None));
    let (first, eof) = read(&mut agent, "/workspace/big", 0, 10 << 20).unwrap();
    assert_eq!((first.len(), eof), (1 << 20, false));
    let (rest, eof) = read(&mut agent, "/workspace/big", 1 << 20, 10 << 20).unwrap();
    assert!(eof);
    assert!([first, rest].concat() == content);
    agent.shutdown();
}

#[test]
fn list_and_stat_describe_entries_without_following_symlinks() {
    let mut agent = TestAgent::start();
    std::fs::create_dir(agent.host_path("/workspace/dir")).unwrap();
    std::fs::write(agent.host_path("/workspace/file"), b"12345").unwrap();
    symlink("/etc/passwd", agent.host_path("/workspace/link")).unwrap();
    let Message::FileEntries { entries } = agent.request(1, Message::FileList { path: "/workspace/".into() }) else {
        panic!("no entries")
    };
    let summary: Vec<_> = entries.iter().map(|e| (e.name.as_str(), e.kind, e.path.as_str())).collect();
    assert_eq!(
        summary,
        [
            ("dir", FileKind::Dir, "/workspace/dir"),
            ("file", FileKind::File, "/workspace/file"),
            ("link", FileKind::Symlink, "/workspace/link"),
        ]
    );
    assert_eq!(entries[1].size, 5);
    assert_eq!(entries[2].symlink_target.as_deref(), Some("/etc/passwd"));
    let Message::FileStatReply { info } = agent.request(1, Message::FileStat { path: "/workspace/link".into() }) else {
        panic!("no stat")
    };
    let described = (info.kind, info.name.as_str(), info.symlink_target.as_deref());
    assert_eq!(described, (FileKind::Symlink, "link", Some("/etc/passwd")));
    let list_file = agent.request(1, Message::FileList { path: "/workspace/file".into() });
    assert_eq!(code(list_file), Some(FailureKind::NotADirectory));
    let stat_none = agent.request(1, Message::FileStat { path: "/workspace/none".into() });
    assert_eq!(code(stat_none), Some(FailureKind::NotFound));
    assert_eq!(code(agent.request(1, Message::FileStat { path: "workspace".into() })), Some(FailureKind::InvalidPath));
    agent.shutdown();
}

#[test]
fn mkdir_rename_and_remove() {
    let mut agent = TestAgent::start();
    let mkdir = |path: &str, parents| Message::Mkdir { path: path.into(), parents };
    assert_eq!(code(agent.request(1, mkdir("/workspace/a/b/c", false))), Some(FailureKind::NotFound));
    assert_eq!(code(agent.request(1, mkdir("/workspace/a/b/c", true))), None);
    assert_eq!(code(agent.request(1, mkdir("/workspace/a/b/c", true))), None);
    assert_eq!(code(agent.request(1, mkdir("/workspace/a", false))), Some(FailureKind::AlreadyExists));
    agent.request(1, write("/workspace/a/b/c/f", b"x", false, None));
    assert_eq!(code(agent.request(1, mkdir("/workspace/a/b/c/f/g", true))), Some(FailureKind::NotADirectory));
    let rename = Message::Rename { from: "/workspace/a/b/c/f".into(), to: "/workspace/g".into() };
    assert_eq!(code(agent.request(1, rename)), None);
    assert!(agent.host_path("/workspace/g").is_file());
    let remove = |path: &str, recursive| Message::Remove { path: path.into(), recursive };
    assert_eq!(code(agent.request(1, remove("/workspace/a", false))), Some(FailureKind::NotEmpty));
    assert_eq!(code(agent.request(1, remove("/workspace/a", true))), None);
    assert_eq!(code(agent.request(1, remove("/workspace/g", false))), None);
    assert_eq!(code(agent.request(1, remove("/workspace/g", false))), Some(FailureKind::NotFound));
    assert_eq!(code(agent.request(1, remove("/", true))), Some(FailureKind::InvalidPath));
    assert!(std::fs::read_dir(agent.host_path("/workspace")).unwrap().next().is_none());
    agent.shutdown();
}

#[test]
fn dot_dot_traversal_stays_inside_the_root() {
    let mut agent = TestAgent::start();
    std::fs::create_dir(agent.host_path("/etc")).unwrap();
    std::fs::write(agent.host_path("/etc/passwd"), b"inside\n").unwrap();
    assert_eq!(read(&mut agent, "/../../etc/passwd", 0, 100), Ok((b"inside\n".to_vec(), true)));
    assert_eq!(read(&mut agent, "/workspace/../../../../etc/passwd", 0, 100), Ok((b"inside\n".to_vec(), true)));
    let outside = agent.root.path().parent().unwrap().join("sandkasten-escaped.txt");
    agent.request(1, write("/../sandkasten-escaped.txt", b"x", false, None));
    assert!(!outside.exists(), "a write escaped the root");
    assert!(agent.host_path("/sandkasten-escaped.txt").exists() || test_identity().is_none());
    agent.shutdown();
}

#[test]
fn symlinks_inside_the_root_cannot_point_out_of_it() {
    let mut agent = TestAgent::start();
    std::fs::create_dir(agent.host_path("/etc")).unwrap();
    std::fs::write(agent.host_path("/etc/passwd"), b"inside\n").unwrap();
    symlink("/etc", agent.host_path("/workspace/etc_link")).unwrap();
    symlink("../../../../../../..", agent.host_path("/workspace/up")).unwrap();
    assert_eq!(read(&mut agent, "/workspace/etc_link/passwd", 0, 100), Ok((b"inside\n".to_vec(), true)));
    assert_eq!(read(&mut agent, "/workspace/up/etc/passwd", 0, 100), Ok((b"inside\n".to_vec(), true)));
    // A write and a rename through the link land inside the root too.
    agent.request(1, write("/workspace/up/workspace/through", b"x", false, None));
    assert!(agent.host_path("/workspace/through").exists());
    let rename = Message::Rename { from: "/workspace/through".into(), to: "/workspace/up/workspace/moved".into() };
    assert_eq!(code(agent.request(1, rename)), None);
    assert!(agent.host_path("/workspace/moved").exists());
    agent.shutdown();
}

#[test]
fn recursive_remove_deletes_links_not_their_targets() {
    let mut agent = TestAgent::start();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), b"precious").unwrap();
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::create_dir_all(agent.host_path("/workspace/d/sub")).unwrap();
    std::fs::write(agent.host_path("/workspace/d/sub/f"), b"x").unwrap();
    symlink(outside.path(), agent.host_path("/workspace/d/link")).unwrap();
    symlink("/workspace", agent.host_path("/workspace/d/sub/self")).unwrap();
    if let Some(identity) = test_identity() {
        for path in ["/workspace/d", "/workspace/d/sub", "/workspace/d/sub/f"] {
            std::os::unix::fs::chown(agent.host_path(path), Some(identity.uid), Some(identity.gid)).unwrap();
        }
    }
    assert_eq!(code(agent.request(1, Message::Remove { path: "/workspace/d".into(), recursive: true })), None);
    assert!(!agent.host_path("/workspace/d").exists());
    assert!(agent.host_path("/workspace").is_dir());
    assert_eq!(std::fs::read(outside.path().join("keep")).unwrap(), b"precious");
    agent.shutdown();
}

#[test]
fn file_operations_have_the_sandbox_users_permissions_not_the_agents() {
    if test_identity().is_none() {
        return;
    }
    let mut agent = TestAgent::start();
    let secret = agent.host_path("/workspace/secret");
    std::fs::write(&secret, b"root only").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir(agent.host_path("/etc")).unwrap();
    std::fs::write(agent.host_path("/etc/hostname"), b"sandbox\n").unwrap();
    assert_eq!(read(&mut agent, "/workspace/secret", 0, 100), Err(FailureKind::PermissionDenied));
    let overwrite = agent.request(1, write("/workspace/secret", b"x", false, None));
    assert_eq!(code(overwrite), Some(FailureKind::PermissionDenied));
    assert_eq!(code(agent.request(1, write("/etc/new", b"x", false, None))), Some(FailureKind::PermissionDenied));
    let remove_etc = agent.request(1, Message::Remove { path: "/etc".into(), recursive: true });
    assert_eq!(code(remove_etc), Some(FailureKind::PermissionDenied));
    assert_eq!(std::fs::read(&secret).unwrap(), b"root only");
    assert!(agent.host_path("/etc/hostname").exists());
    // The agent's own identity is back after each operation: it still reads what it needs.
    assert_eq!(code(agent.request(1, write("/workspace/mine", b"ok", false, None))), None);
    assert_eq!(read(&mut agent, "/workspace/mine", 0, 100), Ok((b"ok".to_vec(), true)));
    agent.shutdown();
}

#[test]
fn fifos_and_devices_are_refused_without_blocking() {
    let mut agent = TestAgent::start();
    let fifo = std::ffi::CString::new(agent.host_path("/workspace/fifo").to_string_lossy().as_bytes()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
    std::fs::set_permissions(agent.host_path("/workspace/fifo"), std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(read(&mut agent, "/workspace/fifo", 0, 10), Err(FailureKind::InvalidPath));
    assert_eq!(code(agent.request(1, write("/workspace/fifo", b"x", false, None))), Some(FailureKind::InvalidPath));
    assert_eq!(read(&mut agent, "/workspace", 0, 10), Err(FailureKind::IsADirectory));
    agent.shutdown();
}

#[test]
fn pipelined_requests_are_all_answered_when_replies_exceed_the_high_water_mark() {
    let mut agent = TestAgent::start();
    let content = vec![7u8; 1 << 20];
    agent.request(1, write("/workspace/big", &content, false, None));
    // Ten 1 MiB reads sent at once: their replies (~14 MiB) pass the 4 MiB mark, so the agent stops taking requests
    // halfway, and must take the rest once the host has read replies, without any new bytes from the host.
    for id in 10..20 {
        agent.send(id, Message::FileRead { path: "/workspace/big".into(), offset: 0, len: 1 << 20 });
    }
    for id in 10..20 {
        assert!(matches!(agent.recv_for(id), Message::FileData { eof: true, .. }), "reply {id}");
    }
    agent.shutdown();
}

#[test]
fn disk_usage_counts_each_writable_filesystem_once() {
    let mut agent = TestAgent::start();
    // `/tmp` on the same filesystem as the home: one filesystem; `/dev/shm` missing: skipped.
    std::fs::create_dir(agent.host_path("/tmp")).unwrap();
    let Message::DiskUsageReply { usage } = agent.request(1, Message::DiskUsage) else { panic!("no disk usage") };
    let host = rustix::fs::statfs(agent.root.path()).unwrap();
    let block = host.f_bsize as u64;
    assert_eq!(usage.total_bytes, host.f_blocks as u64 * block, "{usage:?}");
    assert!(usage.used_bytes > 0 && usage.used_bytes <= usage.total_bytes, "{usage:?}");
}
