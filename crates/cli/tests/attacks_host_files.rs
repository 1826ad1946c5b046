//! The host's read-only files a sandbox sees (`/usr`) are not a lever on the host: code inside cannot evict a host
//! file from the page cache (`posix_fadvise(POSIX_FADV_DONTNEED)`), make the host flush its disk (`syncfs` on a
//! `/usr` descriptor, 300 times), read the host's boot id or watch (inotify) what the host opens and runs. Each attack
//! runs for real inside; the host checks its own page cache (`mincore` of the file), its disk's flush counter
//! (`/proc/diskstats`) and its boot id, and opens and runs the watched files itself.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use common::*;

per_tier!(
    fadvise_dontneed_cannot_evict_a_host_file_from_the_page_cache,
    syncfs_on_usr_cannot_make_the_host_flush_its_disk,
    the_hosts_boot_id_is_not_visible,
    inotify_on_host_files_sees_nothing_of_the_hosts_opens,
);

/// A host file under `/usr` that the sandbox sees but nothing maps (mapped pages are never evicted, which would hide
/// the attack).
const VICTIM: &str = "/usr/lib/python3.11/pydoc_data/topics.py";

/// Pages of `path` in the host's page cache, and the file's pages.
fn resident_pages(path: &str) -> (usize, usize) {
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    let page = 4096;
    let pages = len.div_ceil(page);
    // SAFETY: a private read-only mapping of an open file, unmapped below; mincore writes one byte per page into a
    // vector of exactly that many bytes.
    unsafe {
        let map = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
        assert_ne!(map, libc::MAP_FAILED);
        let mut vec = vec![0u8; pages];
        assert_eq!(libc::mincore(map, len, vec.as_mut_ptr()), 0);
        libc::munmap(map, len);
        (vec.iter().filter(|b| **b & 1 == 1).count(), pages)
    }
}

fn fadvise_dontneed_cannot_evict_a_host_file_from_the_page_cache(tier: Tier) {
    if !std::path::Path::new(VICTIM).exists() {
        eprintln!("skipped: {VICTIM} is not installed");
        return;
    }
    // Cache the whole file on the host.
    std::fs::read(VICTIM).unwrap();
    let (before, pages) = resident_pages(VICTIM);
    assert!(before * 10 >= pages * 9, "positive control: the file is cached on the host ({before}/{pages})");
    let code = format!(
        "import os\nfd = os.open({VICTIM:?}, os.O_RDONLY)\nfor _ in range(3):\n    try:\n        \
         os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)\n        print('advised')\n    except OSError as e:\n        \
         print('refused', e.errno)\n"
    );
    let r = code_on(tier, "python", &code, &[]).json();
    r.assert_exit(0);
    let (after, _) = resident_pages(VICTIM);
    assert!(
        after * 10 >= pages * 9,
        "the sandbox evicted a host file from the page cache: {before} → {after} of {pages} pages\n{}",
        r.describe()
    );
    if tier == Tier::Process {
        assert!(r.stdout().contains("refused 1"), "fadvise(DONTNEED) must be refused (EPERM)\n{}", r.describe());
    }
}

/// The flush requests completed by the block device holding `/usr` (`/proc/diskstats`), if the kernel counts them.
fn disk_flushes() -> Option<u64> {
    let dev = std::fs::metadata("/usr").unwrap().dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let stats = std::fs::read_to_string("/proc/diskstats").unwrap();
    stats.lines().find_map(|line| {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let matches = parts.first()?.parse::<u32>().ok()? == major && parts.get(1)?.parse::<u32>().ok()? == minor;
        if matches { parts.get(18)?.parse().ok() } else { None }
    })
}

fn syncfs_on_usr_cannot_make_the_host_flush_its_disk(tier: Tier) {
    let Some(start) = disk_flushes() else {
        eprintln!("skipped: the kernel does not count flush requests of the device holding /usr");
        return;
    };
    let code = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nfd = os.open('/usr/bin', os.O_RDONLY)\n\
                ok = sum(1 for _ in range(300) if libc.syncfs(fd) == 0)\nprint('syncfs ok', ok, 'errno', ctypes.get_errno())\n";
    let r = code_on(tier, "python", code, &[]).json();
    r.assert_exit(0);
    let flushed = disk_flushes().unwrap() - start;
    // Other host activity may flush a few times meanwhile; 300 answered calls would be 300 flushes.
    assert!(flushed < 100, "300 syncfs calls inside made the host flush its disk {flushed} times\n{}", r.describe());
    if tier == Tier::Process {
        assert!(r.stdout().contains("syncfs ok 0 errno 1"), "syncfs must be refused (EPERM)\n{}", r.describe());
    }
}

fn the_hosts_boot_id_is_not_visible(tier: Tier) {
    let host = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let code = "try:\n    print(repr(open('/proc/sys/kernel/random/boot_id').read()))\nexcept OSError as e:\n    print('denied', e.errno)\n";
    let r = code_on(tier, "python", code, &[]).json();
    r.assert_exit(0);
    assert!(!r.stdout().contains(host.trim()), "the host's boot id is visible inside\n{}", r.describe());
}

/// inotify watches inodes: were `/usr` and the `/etc` files bound into the sandbox (the same inodes as the host's), a
/// watch inside would report every open of them by the host and by neighbouring sandboxes (which programs run, when,
/// how often). The sandbox watches `/usr/bin`, `/usr/bin/true`, libc and `/etc/ld.so.cache` (which the dynamic loader
/// opens for every program started); meanwhile the host, then a neighbouring sandbox, read and run `/usr/bin/true`
/// and list `/usr/bin`. The sandbox must see none of it, and must see its own open of `/usr/bin/true` (the watches
/// are live).
fn inotify_on_host_files_sees_nothing_of_the_hosts_opens(tier: Tier) {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let libc_path = ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6", "/usr/lib/libc.so.6"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("a libc under /usr");
    let code = format!(
        "import ctypes, os, sys\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        fd = libc.inotify_init1(os.O_NONBLOCK)\n\
        paths = ['/usr/bin', '/usr/bin/true', {libc_path:?}, '/etc/ld.so.cache']\n\
        wds = [libc.inotify_add_watch(fd, p.encode(), 0x20 | 0x01) for p in paths]\n\
        print('watching', *wds, flush=True)\n\
        sys.stdin.readline()\n\
        def drain():\n\
        \x20   n = 0\n\
        \x20   while True:\n\
        \x20       try:\n\
        \x20           data = os.read(fd, 65536)\n\
        \x20       except BlockingIOError:\n\
        \x20           return n\n\
        \x20       i = 0\n\
        \x20       while i < len(data):\n\
        \x20           n += 1; i += 16 + int.from_bytes(data[i + 12:i + 16], 'little')\n\
        host = drain()\n\
        open('/usr/bin/true', 'rb').read(1)\n\
        print('host', host, 'own', drain(), flush=True)\n"
    );
    let mut child = Command::new(bin())
        .args(["run", "--isolation", tier.name(), "--timeout", "60s", "--lang", "python", "--code", &code])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut watching = String::new();
    out.read_line(&mut watching).unwrap();
    let wds: Vec<i64> = watching.split_whitespace().skip(1).filter_map(|n| n.parse().ok()).collect();
    assert!(watching.starts_with("watching ") && wds.len() == 4, "the sandbox set no watches: {watching:?}");
    assert!(wds.iter().all(|wd| *wd > 0), "a watch was refused ({watching:?}): nothing to prove");
    // The host opens, reads and runs what the sandbox watches, several times.
    for _ in 0..5 {
        std::fs::read("/usr/bin/true").unwrap();
        std::fs::read(libc_path).unwrap();
        std::fs::read("/etc/ld.so.cache").unwrap();
        assert!(Command::new("/usr/bin/true").status().unwrap().success());
        std::fs::read_dir("/usr/bin").unwrap().count();
    }
    // And a neighbouring sandbox of the same tier runs the same program and reads the same files.
    let neighbour = Command::new(bin())
        .args(["run", "--isolation", tier.name(), "--", "/bin/sh", "-c"])
        .arg(format!(
            "/usr/bin/true && cat /usr/bin/true {libc_path} /etc/ld.so.cache > /dev/null && ls /usr/bin > /dev/null"
        ))
        .output()
        .unwrap();
    assert!(neighbour.status.success(), "the neighbour's run failed: {neighbour:?}");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let mut seen = String::new();
    out.read_line(&mut seen).unwrap();
    let status = child.wait().unwrap();
    eprintln!("{tier}: {watching:?} then {seen:?} ({status})");
    let counts: Vec<u64> = seen.split_whitespace().filter_map(|n| n.parse().ok()).collect();
    assert!(seen.starts_with("host ") && counts.len() == 2, "no answer from the sandbox: {seen:?} ({status})");
    assert_eq!(counts[0], 0, "the sandbox's inotify reported {} of the host's opens: {seen:?}", counts[0]);
    assert!(counts[1] > 0, "the sandbox's own open of a watched file was not reported: the test proves nothing");
    assert!(status.success(), "the run failed: {status}");
}
