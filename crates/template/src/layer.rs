//! Layers as tar archives, OCI-style: an overlay upper directory is packed into a deterministic tar (entries sorted,
//! times and owners zeroed) in which a deletion is a `.wh.NAME` entry and an opaque directory holds `.wh..wh..opq`;
//! unpacking turns those back into what overlayfs reads in a lower layer (a `0:0` character device; the
//! `user.overlay.opaque` attribute that an overlay mounted in a user namespace reads).

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, XattrFlags};

use crate::error::CacheError;

/// The prefix of a whiteout entry's name.
pub const WHITEOUT_PREFIX: &str = ".wh.";
/// The name of the entry that marks its directory opaque.
pub const OPAQUE_MARKER: &str = ".wh..wh..opq";
/// The attributes overlayfs reads: `user.` in a user namespace (`userxattr`), `trusted.` otherwise.
const OPAQUE_ATTRIBUTES: &[&str] = &["user.overlay.opaque", "trusted.overlay.opaque"];
const WHITEOUT_ATTRIBUTES: &[&str] = &["user.overlay.whiteout", "trusted.overlay.whiteout"];
/// What `OPAQUE_ATTRIBUTES` is set to on unpack.
const UNPACKED_OPAQUE_ATTRIBUTE: &str = "user.overlay.opaque";

fn has_attribute(path: &Path, names: &[&str], value: Option<&[u8]>) -> bool {
    names.iter().any(|name| {
        let mut buffer = [0u8; 8];
        match rustix::fs::lgetxattr(path, *name, &mut buffer[..]) {
            Ok(length) => value.is_none_or(|expected| buffer.get(..length) == Some(expected)),
            Err(_) => false,
        }
    })
}

/// Packs the tree under `upper` into the tar `out`.
pub fn pack(upper: &Path, out: impl Write) -> Result<(), CacheError> {
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    pack_dir(&mut builder, upper, Path::new(""))?;
    builder.into_inner().map_err(CacheError::io("finishing the layer archive of", upper))?;
    Ok(())
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode & 0o7777);
    header.set_size(size);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header
}

fn pack_dir<W: Write>(builder: &mut tar::Builder<W>, dir: &Path, relative: &Path) -> Result<(), CacheError> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .map_err(CacheError::io("reading", dir))?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(CacheError::io("reading", dir))?;
    names.sort();
    let append = |builder: &mut tar::Builder<W>, header: &mut tar::Header, name: &Path, data: &mut dyn Read| {
        builder.append_data(header, name, data).map_err(CacheError::io("archiving", name.to_path_buf()))
    };
    for name in names {
        let path = dir.join(&name);
        let inside = relative.join(&name);
        let meta = fs::symlink_metadata(&path).map_err(CacheError::io("reading", &path))?;
        let kind = meta.file_type();
        let whiteout_device = kind.is_char_device() && meta.rdev() == 0;
        let whiteout_file = kind.is_file() && meta.len() == 0 && has_attribute(&path, WHITEOUT_ATTRIBUTES, None);
        if !(whiteout_device || whiteout_file) && name.to_string_lossy().starts_with(WHITEOUT_PREFIX) {
            return Err(CacheError::BadEntry {
                entry: inside.to_string_lossy().into_owned(),
                reason: "names starting with '.wh.' are whiteout markers in a layer: rename the file",
            });
        }
        if whiteout_device || whiteout_file {
            let marker = relative.join(format!("{WHITEOUT_PREFIX}{}", name.to_string_lossy()));
            append(builder, &mut header(tar::EntryType::Regular, 0o644, 0), &marker, &mut std::io::empty())?;
        } else if kind.is_dir() {
            append(builder, &mut header(tar::EntryType::Directory, meta.mode(), 0), &inside, &mut std::io::empty())?;
            if has_attribute(&path, OPAQUE_ATTRIBUTES, Some(b"y")) {
                let marker = inside.join(OPAQUE_MARKER);
                append(builder, &mut header(tar::EntryType::Regular, 0o644, 0), &marker, &mut std::io::empty())?;
            }
            pack_dir(builder, &path, &inside)?;
        } else if kind.is_symlink() {
            let target = fs::read_link(&path).map_err(CacheError::io("reading", &path))?;
            let mut link = header(tar::EntryType::Symlink, 0o777, 0);
            builder.append_link(&mut link, &inside, &target).map_err(CacheError::io("archiving", &path))?;
        } else if kind.is_file() {
            let mut file = fs::File::open(&path).map_err(CacheError::io("reading", &path))?;
            append(builder, &mut header(tar::EntryType::Regular, meta.mode(), meta.len()), &inside, &mut file)?;
        } else {
            return Err(CacheError::BadEntry {
                entry: inside.to_string_lossy().into_owned(),
                reason: "a layer holds only files, directories and symlinks (no fifos, sockets or devices)",
            });
        }
    }
    Ok(())
}

/// The relative path of an archive entry, refused when it is absolute or climbs out with `..`.
fn entry_path(raw: &Path) -> Result<PathBuf, CacheError> {
    let mut clean = PathBuf::new();
    for component in raw.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            _ => {
                return Err(CacheError::BadEntry {
                    entry: raw.to_string_lossy().into_owned(),
                    reason: "absolute or '..' paths are refused",
                });
            }
        }
    }
    Ok(clean)
}

/// Unpacks the layer archive `archive` into the empty directory `dest`, whiteouts as overlayfs reads them. Files
/// are owned by whoever unpacks (the host's root); symlinks are created as they are (they resolve inside the
/// sandbox that mounts the layer, never here: nothing is written through one, since every entry's parents are
/// checked to be real directories).
pub fn unpack(archive: impl Read, dest: &Path) -> Result<(), CacheError> {
    let mut archive = tar::Archive::new(archive);
    for entry in archive.entries().map_err(CacheError::io("reading the layer archive for", dest))? {
        let mut entry = entry.map_err(CacheError::io("reading the layer archive for", dest))?;
        let raw = entry.path().map_err(CacheError::io("reading the layer archive for", dest))?.into_owned();
        let relative = entry_path(&raw)?;
        let Some(name) = relative.file_name().map(|n| n.to_string_lossy().into_owned()) else { continue };
        let parent = dest.join(relative.parent().unwrap_or(Path::new("")));
        ensure_real_dirs(dest, &parent)?;
        // No setuid/setgid/sticky bits and no group or other write: the layer is root's on the host, and a build step
        // must not leave host users a way to change what later sandboxes run.
        let mode = entry.header().mode().unwrap_or(0o644) & 0o755;
        if name == OPAQUE_MARKER {
            rustix::fs::lsetxattr(&parent, UNPACKED_OPAQUE_ATTRIBUTE, b"y", XattrFlags::empty())
                .map_err(|e| CacheError::Io { action: "marking opaque", path: parent.clone(), source: e.into() })?;
            continue;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            if hidden.is_empty() || hidden == "." || hidden == ".." {
                return Err(CacheError::BadEntry { entry: name, reason: "a whiteout must name an entry" });
            }
            let target = parent.join(hidden);
            rustix::fs::mknodat(rustix::fs::CWD, &target, FileType::CharacterDevice, Mode::empty(), 0).map_err(
                |e| CacheError::Io { action: "creating the whiteout", path: target.clone(), source: e.into() },
            )?;
            continue;
        }
        let target = dest.join(&relative);
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                match fs::symlink_metadata(&target) {
                    Ok(meta) if meta.is_dir() => {}
                    Ok(_) => {
                        return Err(CacheError::BadEntry {
                            entry: raw.to_string_lossy().into_owned(),
                            reason: "a directory entry over an existing file or symlink is refused",
                        });
                    }
                    Err(_) => {
                        fs::DirBuilder::new().mode(mode).create(&target).map_err(CacheError::io("creating", &target))?
                    }
                }
                fs::set_permissions(&target, fs::Permissions::from_mode(mode))
                    .map_err(CacheError::io("chmod", &target))?;
            }
            tar::EntryType::Regular => {
                let mut file = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode)
                    .open(&target)
                    .map_err(CacheError::io("creating", &target))?;
                std::io::copy(&mut entry, &mut file).map_err(CacheError::io("writing", &target))?;
                fs::set_permissions(&target, fs::Permissions::from_mode(mode))
                    .map_err(CacheError::io("chmod", &target))?;
            }
            tar::EntryType::Symlink => {
                let points_to =
                    entry.link_name().map_err(CacheError::io("reading the link", &target))?.ok_or_else(|| {
                        CacheError::BadEntry { entry: name.clone(), reason: "a symlink without a target" }
                    })?;
                std::os::unix::fs::symlink(&points_to, &target).map_err(CacheError::io("creating", &target))?;
            }
            _ => {
                return Err(CacheError::BadEntry {
                    entry: raw.to_string_lossy().into_owned(),
                    reason: "only files, directories, symlinks and whiteouts may be in a layer",
                });
            }
        }
    }
    Ok(())
}

/// Creates `dir` (under `root`) and its missing parents, refusing a parent that is a symlink (an archive must not
/// write through a link it made).
fn ensure_real_dirs(root: &Path, dir: &Path) -> Result<(), CacheError> {
    let Ok(relative) = dir.strip_prefix(root) else { return Ok(()) };
    let mut at = root.to_path_buf();
    for part in relative.components() {
        at.push(part);
        match fs::symlink_metadata(&at) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(CacheError::BadEntry {
                    entry: at.to_string_lossy().into_owned(),
                    reason: "an entry's parent is not a directory",
                });
            }
            Err(_) => fs::DirBuilder::new().mode(0o755).create(&at).map_err(CacheError::io("creating", &at))?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(archive: &[u8]) -> Vec<String> {
        let mut archive = tar::Archive::new(archive);
        let entries = archive.entries().unwrap_or_else(|e| panic!("{e}"));
        entries
            .map(|e| e.unwrap_or_else(|e| panic!("{e}")).path().unwrap_or_default().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn whiteouts_and_opaque_dirs_become_oci_entries_and_come_back() {
        let upper = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let at = |p: &str| upper.path().join(p);
        fs::create_dir_all(at("opt/app/lib")).unwrap_or_else(|e| panic!("{e}"));
        fs::write(at("opt/app/run.sh"), "echo hi").unwrap_or_else(|e| panic!("{e}"));
        fs::set_permissions(at("opt/app/run.sh"), fs::Permissions::from_mode(0o755)).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink("run.sh", at("opt/app/link")).unwrap_or_else(|e| panic!("{e}"));
        rustix::fs::mknodat(rustix::fs::CWD, at("opt/gone"), FileType::CharacterDevice, Mode::empty(), 0)
            .unwrap_or_else(|e| panic!("mknod (tests run as root): {e}"));
        rustix::fs::lsetxattr(at("opt/app/lib"), "user.overlay.opaque", b"y", XattrFlags::empty())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut archive = Vec::new();
        pack(upper.path(), &mut archive).unwrap_or_else(|e| panic!("{e}"));
        let listed = names(&archive);
        assert!(listed.contains(&"opt/.wh.gone".to_owned()), "{listed:?}");
        assert!(listed.contains(&"opt/app/lib/.wh..wh..opq".to_owned()), "{listed:?}");

        let mut again = Vec::new();
        pack(upper.path(), &mut again).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(archive, again, "packing is deterministic (the digest names the content)");

        let dest = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        unpack(&archive[..], dest.path()).unwrap_or_else(|e| panic!("{e}"));
        let gone = fs::symlink_metadata(dest.path().join("opt/gone")).unwrap_or_else(|e| panic!("{e}"));
        assert!(gone.file_type().is_char_device() && gone.rdev() == 0, "the whiteout is a 0:0 device again");
        assert!(has_attribute(&dest.path().join("opt/app/lib"), OPAQUE_ATTRIBUTES, Some(b"y")));
        let script = fs::metadata(dest.path().join("opt/app/run.sh")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(script.mode() & 0o777, 0o755);
        assert_eq!(fs::read_link(dest.path().join("opt/app/link")).ok(), Some(PathBuf::from("run.sh")));
    }

    #[test]
    fn entries_that_climb_out_or_write_through_links_are_refused() {
        let mut builder = tar::Builder::new(Vec::new());
        let mut link = header(tar::EntryType::Symlink, 0o777, 0);
        builder.append_link(&mut link, "opt/escape", "/etc").unwrap_or_else(|e| panic!("{e}"));
        builder
            .append_data(&mut header(tar::EntryType::Regular, 0o644, 1), "opt/escape/passwd", &b"x"[..])
            .unwrap_or_else(|e| panic!("{e}"));
        let archive = builder.into_inner().unwrap_or_else(|e| panic!("{e}"));
        let dest = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let refused = unpack(&archive[..], dest.path());
        assert!(matches!(refused, Err(CacheError::BadEntry { .. })), "{refused:?}");
        assert!(entry_path(Path::new("../x")).is_err());
        assert!(entry_path(Path::new("/x")).is_err());
    }

    #[test]
    fn a_directory_entry_over_a_symlink_never_changes_what_the_link_points_to() {
        use std::os::unix::fs::PermissionsExt;
        let canary = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        fs::set_permissions(canary.path(), fs::Permissions::from_mode(0o700)).unwrap_or_else(|e| panic!("{e}"));
        let mut builder = tar::Builder::new(Vec::new());
        let mut link = header(tar::EntryType::Symlink, 0o777, 0);
        builder.append_link(&mut link, "opt/x", canary.path()).unwrap_or_else(|e| panic!("{e}"));
        builder
            .append_data(&mut header(tar::EntryType::Directory, 0o777, 0), "opt/x", std::io::empty())
            .unwrap_or_else(|e| panic!("{e}"));
        let archive = builder.into_inner().unwrap_or_else(|e| panic!("{e}"));
        let dest = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let refused = unpack(&archive[..], dest.path());
        assert!(matches!(refused, Err(CacheError::BadEntry { .. })), "{refused:?}");
        let mode = fs::metadata(canary.path()).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0);
        assert_eq!(mode, 0o700, "the link's target kept its mode");
    }

    #[test]
    fn unpacked_modes_lose_setuid_and_foreign_write_and_whiteouts_must_name_an_entry() {
        use std::os::unix::fs::PermissionsExt;
        let mut builder = tar::Builder::new(Vec::new());
        builder
            .append_data(&mut header(tar::EntryType::Directory, 0o1777, 0), "opt/d", std::io::empty())
            .unwrap_or_else(|e| panic!("{e}"));
        builder
            .append_data(&mut header(tar::EntryType::Regular, 0o6777, 1), "opt/d/f", &b"x"[..])
            .unwrap_or_else(|e| panic!("{e}"));
        let archive = builder.into_inner().unwrap_or_else(|e| panic!("{e}"));
        let dest = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        unpack(&archive[..], dest.path()).unwrap_or_else(|e| panic!("{e}"));
        let mode = |path: &str| fs::metadata(dest.path().join(path)).map(|m| m.permissions().mode() & 0o7777);
        assert_eq!(mode("opt/d").unwrap_or(0), 0o755);
        assert_eq!(mode("opt/d/f").unwrap_or(0), 0o755);
        for hidden in ["", ".", ".."] {
            let mut builder = tar::Builder::new(Vec::new());
            let name = format!("opt/.wh.{hidden}");
            builder
                .append_data(&mut header(tar::EntryType::Regular, 0o644, 0), &name, std::io::empty())
                .unwrap_or_else(|e| panic!("{e}"));
            let archive = builder.into_inner().unwrap_or_else(|e| panic!("{e}"));
            let dest = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
            let refused = unpack(&archive[..], dest.path());
            assert!(refused.is_err(), "whiteout {name:?}: {refused:?}");
        }
    }

    #[test]
    fn a_real_file_named_like_a_whiteout_is_refused_when_packing() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        fs::write(dir.path().join(".wh.config"), b"x").unwrap_or_else(|e| panic!("{e}"));
        let refused = pack(dir.path(), Vec::new());
        assert!(matches!(refused, Err(CacheError::BadEntry { .. })), "{refused:?}");
    }
}
