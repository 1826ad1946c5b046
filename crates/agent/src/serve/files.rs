//! The file requests of serve mode: read in chunks, write (truncate or append), list, stat, mkdir, rename, remove,
//! set metadata (`metadata`). Every path goes through `SandboxRoot` (resolved inside the root, with the sandbox user's
//! permissions, or the sandbox root's without capabilities for `AsUser`); nothing
//! here blocks on a fifo or a device, because only regular files are read or written.

use std::os::fd::{AsFd, OwnedFd};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use sandkasten_protocol::{MAX_FILE_CHUNK_BYTES, Message};
use sandkasten_types::{CommandUser, Failure, FailureKind, FileInfo, FileKind};

use super::errors::sys_failure;
use super::paths::{SandboxRoot, join, split_parent};
use super::{metadata, remove};

/// Permission bits of a file created without an explicit mode (before the umask).
const DEFAULT_FILE_MODE: u32 = 0o644;
/// Permission bits of created directories (before the umask).
const DIR_MODE: u32 = 0o755;

/// Runs one file request (with the sandbox user's identity, or as `AsUser` says) and returns its reply.
pub fn handle(root: &SandboxRoot, msg: &Message) -> Result<Message, Failure> {
    match msg {
        Message::AsUser { user: CommandUser::Root, request } if is_file_request(request) => {
            root.as_sandbox_root(|| run(root, request))
        }
        Message::AsUser { user: CommandUser::Sandbox, request } if is_file_request(request) => {
            root.as_sandbox_user(|| run(root, request))
        }
        Message::AsUser { .. } => Err(Failure::new(FailureKind::Internal, "as_user holds no file request")),
        other => root.as_sandbox_user(|| run(root, other)),
    }
}

/// Whether `msg` is one of the file requests (what `AsUser` may hold).
pub fn is_file_request(msg: &Message) -> bool {
    matches!(
        msg,
        Message::FileRead { .. }
            | Message::FileWrite { .. }
            | Message::FileList { .. }
            | Message::FileStat { .. }
            | Message::Mkdir { .. }
            | Message::Rename { .. }
            | Message::Remove { .. }
            | Message::SetMetadata { .. }
    )
}

fn run(root: &SandboxRoot, msg: &Message) -> Result<Message, Failure> {
    match msg {
        Message::FileRead { path, offset, len } => read(root, path, *offset, *len),
        Message::FileWrite { path, data, append, mode } => write(root, path, data, *append, *mode),
        Message::FileList { path } => list(root, path),
        Message::FileStat { path } => stat(root, path).map(|info| Message::FileStatReply { info }),
        Message::Mkdir { path, parents } => mkdir(root, path, *parents),
        Message::Rename { from, to } => rename(root, from, to),
        Message::Remove { path, recursive } => remove::remove(root, path, *recursive).map(|()| Message::Done),
        Message::SetMetadata { path, metadata: wanted } => metadata::set(root, path, wanted).map(|()| Message::Done),
        _ => Err(Failure::new(FailureKind::Internal, "not a file request")),
    }
}

fn regular_file(fd: &OwnedFd, path: &str) -> Result<Stat, Failure> {
    let stat = rustix::fs::fstat(fd).map_err(|e| sys_failure("stat", path, e))?;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => Ok(stat),
        FileType::Directory => Err(Failure::new(FailureKind::IsADirectory, format!("{path} is a directory"))),
        _ => Err(Failure::new(FailureKind::InvalidPath, format!("{path} is not a regular file"))),
    }
}

fn read(root: &SandboxRoot, path: &str, offset: u64, len: u64) -> Result<Message, Failure> {
    // O_NONBLOCK: opening a fifo must not wait for a writer (it is refused right after, as not a regular file).
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = root.open_in_root(path, flags, Mode::empty())?;
    let stat = regular_file(&fd, path)?;
    let wanted = len.min(MAX_FILE_CHUNK_BYTES) as usize;
    let mut data = vec![0u8; wanted];
    let mut filled = 0;
    while filled < wanted {
        match rustix::io::pread(&fd, &mut data[filled..], offset.saturating_add(filled as u64)) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(Errno::INTR) => {}
            Err(errno) => return Err(sys_failure("read", path, errno)),
        }
    }
    data.truncate(filled);
    let eof = filled < wanted || offset.saturating_add(filled as u64) >= stat.st_size as u64;
    Ok(Message::FileData { data: STANDARD.encode(&data), eof })
}

fn write(root: &SandboxRoot, path: &str, data: &str, append: bool, mode: Option<u32>) -> Result<Message, Failure> {
    let bytes = STANDARD
        .decode(data)
        .map_err(|e| Failure::new(FailureKind::Internal, format!("file data is not valid base64: {e}")))?;
    let append_flag = if append { OFlags::APPEND } else { OFlags::empty() };
    let base = OFlags::WRONLY | OFlags::NONBLOCK | OFlags::NOCTTY | append_flag;
    let create_mode = Mode::from_raw_mode(mode.unwrap_or(DEFAULT_FILE_MODE) & 0o777);
    let (fd, created) = match root.open_in_root(path, base | OFlags::CREATE | OFlags::EXCL, create_mode) {
        Ok(fd) => (fd, true),
        Err(e) if e.kind == FailureKind::AlreadyExists => (root.open_in_root(path, base, Mode::empty())?, false),
        Err(e) => return Err(e),
    };
    regular_file(&fd, path)?;
    if created && let Some(mode) = mode {
        // The umask applied at creation; the caller asked for exactly these bits.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o777)).map_err(|e| sys_failure("chmod", path, e))?;
    }
    if !append && !created {
        rustix::fs::ftruncate(&fd, 0).map_err(|e| sys_failure("truncate", path, e))?;
    }
    let mut written = 0;
    while written < bytes.len() {
        match rustix::io::write(&fd, &bytes[written..]) {
            Ok(0) => return Err(Failure::new(FailureKind::TooLarge, format!("writing {path}: no space left"))),
            Ok(n) => written += n,
            Err(Errno::INTR) => {}
            Err(errno) => return Err(sys_failure("write", path, errno)),
        }
    }
    Ok(Message::Done)
}

fn kind_of(stat: &Stat) -> FileKind {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => FileKind::File,
        FileType::Directory => FileKind::Dir,
        FileType::Symlink => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

/// Builds the `FileInfo` of `name` inside `dir` without following a symlink.
fn info_at(dir: impl AsFd, name: &str, display_path: String) -> Result<FileInfo, Failure> {
    let stat =
        rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| sys_failure("stat", &display_path, e))?;
    Ok(info_from_stat(&dir, name, display_path, &stat))
}

fn info_from_stat(dir: impl AsFd, name: &str, path: String, stat: &Stat) -> FileInfo {
    let kind = kind_of(stat);
    let symlink_target = (kind == FileKind::Symlink)
        .then(|| rustix::fs::readlinkat(&dir, name, Vec::new()).ok())
        .flatten()
        .map(|target| target.to_string_lossy().into_owned());
    FileInfo {
        name: name.to_owned(),
        path,
        kind,
        size: stat.st_size as u64,
        mode: stat.st_mode & 0o7777,
        modified_unix_ms: stat.st_mtime.saturating_mul(1000).saturating_add(stat.st_mtime_nsec as i64 / 1_000_000),
        symlink_target,
        uid: stat.st_uid,
        gid: stat.st_gid,
        metadata: metadata::read_at(&dir, name, kind),
    }
}

fn stat(root: &SandboxRoot, path: &str) -> Result<FileInfo, Failure> {
    // O_PATH | O_NOFOLLOW opens a final symlink itself: lstat semantics, resolved inside the root.
    let fd = root.open_in_root(path, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| sys_failure("stat", path, e))?;
    let name = split_parent(path).map(|(_, name)| name.to_owned()).unwrap_or_default();
    // readlinkat(fd, "") reads the link the O_PATH descriptor refers to.
    let mut info = info_from_stat(&fd, "", path.to_owned(), &stat);
    // The metadata is read through the parent (an O_PATH descriptor cannot list attributes); `/` has none.
    info.metadata = match root.parent_of(path) {
        Ok((parent, entry)) => metadata::read_at(&parent, &entry, info.kind),
        Err(_) => Default::default(),
    };
    Ok(FileInfo { name: if name.is_empty() { "/".to_owned() } else { name }, ..info })
}

fn list(root: &SandboxRoot, path: &str) -> Result<Message, Failure> {
    let fd = root.open_in_root(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
    let mut dir = rustix::fs::Dir::read_from(&fd).map_err(|e| sys_failure("list", path, e))?;
    let mut entries = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry.map_err(|e| sys_failure("list", path, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        match info_at(&fd, &name, join(path, &name)) {
            Ok(info) => entries.push(info),
            // Removed between readdir and stat: not an entry any more.
            Err(e) if e.kind == FailureKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Message::FileEntries { entries })
}

fn mkdir(root: &SandboxRoot, path: &str, parents: bool) -> Result<Message, Failure> {
    split_parent(path)?;
    if parents {
        let mut prefix = String::new();
        for component in path.split('/').filter(|c| !c.is_empty()) {
            prefix.push('/');
            prefix.push_str(component);
            if component != "." && component != ".." {
                make_one_dir(root, &prefix, true)?;
            }
        }
        Ok(Message::Done)
    } else {
        make_one_dir(root, path, false).map(|()| Message::Done)
    }
}

fn make_one_dir(root: &SandboxRoot, path: &str, existing_is_fine: bool) -> Result<(), Failure> {
    let (dir, name) = root.parent_of(path)?;
    match rustix::fs::mkdirat(&dir, name.as_str(), Mode::from_raw_mode(DIR_MODE)) {
        Ok(()) => Ok(()),
        Err(Errno::EXIST) if existing_is_fine => {
            root.open_in_root(path, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).map(drop).map_err(|e| {
                if e.kind == FailureKind::NotADirectory {
                    Failure::new(FailureKind::NotADirectory, format!("{path} exists and is not a directory"))
                } else {
                    e
                }
            })
        }
        Err(errno) => Err(sys_failure("mkdir", path, errno)),
    }
}

fn rename(root: &SandboxRoot, from: &str, to: &str) -> Result<Message, Failure> {
    let (from_dir, from_name) = root.parent_of(from)?;
    let (to_dir, to_name) = root.parent_of(to)?;
    rustix::fs::renameat(&from_dir, from_name.as_str(), &to_dir, to_name.as_str())
        .map_err(|e| sys_failure("rename", &format!("{from} to {to}"), e))?;
    Ok(Message::Done)
}
