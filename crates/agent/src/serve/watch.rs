//! Directory watches (`WatchStart`/`WatchStop`): one inotify instance per watch, opened as the sandbox user (so a
//! watch reaches only directories that user may read), on directories resolved inside the root like every file
//! request. A recursive watch adds every subdirectory, and each one created later as its `IN_CREATE` arrives (its
//! entries made before the watch was added are reported as created). Events go to the host as `WatchEvents` frames
//! from the serve loop's poll, not while the outgoing queue is congested (the kernel queue holds them meanwhile; past
//! its `max_queued_events` they are lost, as inotify loses them).
//!
//! Bounds: at most `MAX_WATCHES` watches per sandbox and `MAX_WATCHED_DIRS` directories per watch (a deeper tree is
//! refused at the start; subdirectories beyond it later are not watched). The kernel's per-user inotify limits are the
//! sandbox's own (each sandbox has its own host uid range).

use std::collections::{BTreeMap, HashMap};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use sandkasten_protocol::MAX_WATCH_EVENTS_PER_FRAME;
use sandkasten_types::{Failure, FailureKind, FsEvent, FsEventKind};

use super::errors::sys_failure;
use super::paths::SandboxRoot;

/// Most watches one sandbox has at once.
pub const MAX_WATCHES: usize = 16;
/// Most directories one watch covers.
pub const MAX_WATCHED_DIRS: usize = 4096;

/// What each inotify watch asks for.
fn interest() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::MODIFY
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::ATTRIB
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::ONLYDIR
}

/// One watch: its inotify instance and the directory each watch descriptor stands for.
#[derive(Debug)]
pub struct Watch {
    inotify: OwnedFd,
    /// The watched directory, absolute inside the sandbox.
    path: String,
    recursive: bool,
    /// Watch descriptor → the directory's path relative to the watched one (`""`: the watched one).
    dirs: HashMap<i32, String>,
}

/// The sandbox's watches, by id.
#[derive(Debug, Default)]
pub struct Watches {
    table: BTreeMap<u64, Watch>,
}

impl Watches {
    /// Starts watch `id` on the directory `path` (as the sandbox user).
    pub fn start(&mut self, root: &SandboxRoot, id: u64, path: &str, recursive: bool) -> Result<(), Failure> {
        if self.table.contains_key(&id) {
            return Err(Failure::new(FailureKind::Conflict, format!("watch {id} exists already")));
        }
        if self.table.len() >= MAX_WATCHES {
            return Err(Failure::new(
                FailureKind::Conflict,
                format!("this sandbox has {MAX_WATCHES} watches already; stop one first"),
            ));
        }
        let watch = root.as_sandbox_user(|| {
            let dir = root.open_in_root(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).map_err(|e| {
                if e.message.contains("Not a directory") {
                    Failure::new(
                        FailureKind::InvalidPath,
                        format!("{path} is not a directory: only directories are watched"),
                    )
                } else {
                    e
                }
            })?;
            let inotify = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
                .map_err(|e| sys_failure("inotify_init", path, e))?;
            let mut watch =
                Watch { inotify, path: path.trim_end_matches('/').to_owned(), recursive, dirs: HashMap::new() };
            watch.add_tree(&dir, String::new(), None)?;
            Ok(watch)
        })?;
        self.table.insert(id, watch);
        Ok(())
    }

    /// Stops watch `id` (closing its inotify instance removes its kernel watches); an unknown id is fine.
    pub fn stop(&mut self, id: u64) {
        self.table.remove(&id);
    }

    /// The inotify descriptors to poll, with their watch ids.
    pub fn fds(&self) -> impl Iterator<Item = (u64, std::os::fd::BorrowedFd<'_>)> {
        self.table.iter().map(|(&id, watch)| (id, watch.inotify.as_fd()))
    }

    /// Reads what watch `id` has pending, as frames of events (none when nothing is), and whether the watch ended
    /// with them (its directory was removed or moved away: nothing more can come, and it is forgotten).
    pub fn read(&mut self, root: &SandboxRoot, id: u64) -> (Vec<Vec<FsEvent>>, bool) {
        let Some(watch) = self.table.get_mut(&id) else { return (Vec::new(), false) };
        let events = root.as_sandbox_user(|| Ok(watch.drain(root))).unwrap_or_default();
        let ended = watch.dirs.is_empty();
        if ended {
            self.table.remove(&id);
        }
        (events.chunks(MAX_WATCH_EVENTS_PER_FRAME).map(<[FsEvent]>::to_vec).collect(), ended)
    }
}

impl Watch {
    /// Watches `dir` (open, `O_RDONLY | O_DIRECTORY`), known as `relative` under the watched directory, and, when
    /// recursive, every directory below it. `created`: events for what it already holds (a directory that appeared
    /// after the watch started: its entries may predate its watch).
    fn add_tree(
        &mut self,
        dir: &OwnedFd,
        relative: String,
        mut created: Option<&mut Vec<FsEvent>>,
    ) -> Result<(), Failure> {
        let shown = self.path.clone();
        let shown = shown.as_str();
        if self.dirs.len() >= MAX_WATCHED_DIRS {
            return Err(Failure::new(
                FailureKind::Conflict,
                format!("{shown} holds more than {MAX_WATCHED_DIRS} directories: watch a smaller tree"),
            ));
        }
        let proc_path = format!("/proc/self/fd/{}", rustix::fd::AsRawFd::as_raw_fd(dir));
        // The magic link is followed by the kernel to `dir` itself: no path is resolved twice.
        let wd = inotify::add_watch(&self.inotify, proc_path.as_str(), interest())
            .map_err(|e| sys_failure("watch", shown, e))?;
        self.dirs.insert(wd, relative.clone());
        if !self.recursive {
            return Ok(());
        }
        let mut entries = rustix::fs::Dir::read_from(dir).map_err(|e| sys_failure("list", shown, e))?;
        while let Some(entry) = entries.read() {
            let Ok(entry) = entry else { break };
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            let child = join(&relative, &name);
            if let Some(created) = created.as_deref_mut() {
                created.push(FsEvent { name: child.clone(), kind: FsEventKind::Create });
            }
            if !self.recursive || entry.file_type() != rustix::fs::FileType::Directory {
                continue;
            }
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            match rustix::fs::openat(dir, name.as_str(), flags, Mode::empty()) {
                Ok(sub) => self.add_tree(&sub, child, created.as_deref_mut())?,
                // Gone already, or not readable by the sandbox user: not watched.
                Err(Errno::NOENT | Errno::ACCESS | Errno::NOTDIR | Errno::LOOP) => {}
                Err(errno) => return Err(sys_failure("open", shown, errno)),
            }
        }
        Ok(())
    }

    /// Every event the kernel has for this watch, mapped; new subdirectories of a recursive watch are added.
    fn drain(&mut self, root: &SandboxRoot) -> Vec<FsEvent> {
        let mut buffer = [MaybeUninit::<u8>::uninit(); 16 << 10];
        let mut raw: Vec<(i32, ReadFlags, String)> = Vec::new();
        {
            let mut reader = inotify::Reader::new(&self.inotify, &mut buffer);
            loop {
                match reader.next() {
                    Ok(event) => {
                        let name = event.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                        raw.push((event.wd(), event.events(), name));
                    }
                    Err(Errno::INTR) => continue,
                    Err(_) => break,
                }
                if raw.len() >= 4 * MAX_WATCH_EVENTS_PER_FRAME {
                    break;
                }
            }
        }
        let mut events = Vec::new();
        for (wd, flags, name) in raw {
            if flags.contains(ReadFlags::IGNORED) {
                self.dirs.remove(&wd);
                continue;
            }
            let Some(dir) = self.dirs.get(&wd).cloned() else { continue };
            let path = if name.is_empty() { dir.clone() } else { join(&dir, &name) };
            let self_event = flags.intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF);
            // A subdirectory's own removal is also its parent's DELETE: report it once, from the parent.
            if self_event && !dir.is_empty() {
                continue;
            }
            for kind in kinds(flags) {
                events.push(FsEvent { name: path.clone(), kind });
            }
            if self.recursive
                && flags.contains(ReadFlags::ISDIR)
                && flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO)
            {
                self.watch_new_dir(root, &path, &mut events);
            }
        }
        events
    }

    /// A directory created (or moved in) under a recursive watch: watched too (resolved inside the root as the
    /// sandbox user, like every path), and what it already holds reported as created.
    fn watch_new_dir(&mut self, root: &SandboxRoot, relative: &str, events: &mut Vec<FsEvent>) {
        let absolute = format!("{}/{relative}", self.path);
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW;
        let Ok(dir) = root.open_in_root(&absolute, flags, Mode::empty()) else { return };
        // Past the bound (or gone again): the rest of the tree is not watched.
        let _ = self.add_tree(&dir, relative.to_owned(), Some(events));
    }
}

/// `dir/name`, or `name` under the watched directory itself.
fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() { name.to_owned() } else { format!("{dir}/{name}") }
}

/// The E2B-style kinds of one inotify event (fsnotify's mapping: a move away is a rename, a move in a create).
fn kinds(flags: ReadFlags) -> Vec<FsEventKind> {
    let mut kinds = Vec::new();
    if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
        kinds.push(FsEventKind::Create);
    }
    if flags.intersects(ReadFlags::MODIFY) {
        kinds.push(FsEventKind::Write);
    }
    if flags.intersects(ReadFlags::DELETE | ReadFlags::DELETE_SELF) {
        kinds.push(FsEventKind::Remove);
    }
    if flags.intersects(ReadFlags::MOVED_FROM | ReadFlags::MOVE_SELF) {
        kinds.push(FsEventKind::Rename);
    }
    if flags.intersects(ReadFlags::ATTRIB) {
        kinds.push(FsEventKind::Chmod);
    }
    kinds
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::path::Path;

    use super::*;

    fn names(frames: &[Vec<FsEvent>]) -> Vec<(String, FsEventKind)> {
        frames.iter().flatten().map(|event| (event.name.clone(), event.kind)).collect()
    }

    #[test]
    fn a_recursive_watch_reports_what_happens_below_it_and_follows_new_directories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("old")).unwrap();
        let root = SandboxRoot::open(Path::new("/"), None).unwrap();
        let path = dir.path().to_str().unwrap();
        let mut watches = Watches::default();
        watches.start(&root, 1, path, true).unwrap();
        std::fs::write(dir.path().join("old/a.txt"), "a").unwrap();
        std::fs::create_dir(dir.path().join("new")).unwrap();
        let (frames, ended) = watches.read(&root, 1);
        assert!(!ended);
        let seen = names(&frames);
        assert!(seen.contains(&("old/a.txt".into(), FsEventKind::Create)), "{seen:?}");
        assert!(seen.contains(&("new".into(), FsEventKind::Create)), "{seen:?}");
        // The new directory is watched now.
        std::fs::write(dir.path().join("new/b.txt"), "b").unwrap();
        std::fs::rename(dir.path().join("new/b.txt"), dir.path().join("new/c.txt")).unwrap();
        let seen = names(&watches.read(&root, 1).0);
        for wanted in
            [("new/b.txt", FsEventKind::Create), ("new/b.txt", FsEventKind::Rename), ("new/c.txt", FsEventKind::Create)]
        {
            assert!(seen.contains(&(wanted.0.into(), wanted.1)), "{wanted:?} in {seen:?}");
        }
        // Removing the watched directory ends the watch.
        std::fs::remove_dir_all(dir.path()).unwrap();
        let (_, ended) = watches.read(&root, 1);
        assert!(ended, "the watch ends with its directory");
        assert_eq!(watches.fds().count(), 0);
    }

    #[test]
    fn watches_are_bounded_and_only_directories_are_watched() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), "").unwrap();
        let root = SandboxRoot::open(Path::new("/"), None).unwrap();
        let path = dir.path().to_str().unwrap();
        let mut watches = Watches::default();
        let file = watches.start(&root, 99, &format!("{path}/file"), false).unwrap_err();
        assert_eq!(file.kind, FailureKind::InvalidPath, "{file:?}");
        for id in 0..MAX_WATCHES as u64 {
            watches.start(&root, id, path, false).unwrap();
        }
        let refused = watches.start(&root, 100, path, false).unwrap_err();
        assert!(refused.message.contains("watches already"), "{refused:?}");
        watches.stop(0);
        watches.start(&root, 100, path, false).unwrap();
    }
}
