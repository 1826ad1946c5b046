//! A built template's layers as a microVM disk: the layers' `/opt` trees merged as the process tier's overlay shows
//! them (topmost wins, whiteouts and opaque directories applied) into one read-only ext4 image, made on first use and
//! cached under `[microvm] dir`/templates by the layers it holds (SHA-256 of their paths, which name their content
//! digests). The guest's agent mounts it at `/opt` (`sandkasten_agent::microvm::TEMPLATE_SERIAL`).
//!
//! The merge is the kernel's own: an overlay of the layers mounted read-only in a private mount namespace of a child
//! (`unshare --mount`), which `mkfs.ext4 -d` copies; when the child ends, its mount ends with it, so nothing is left
//! mounted on the host however the server dies. The image is written in a staging directory and renamed into place;
//! an image no VM started from for an hour is pruned, as agent disks are.

use std::path::{Path, PathBuf};

use sandkasten_jail::rootfs::{RealHostFs, read_only_overlay_options, template_lowers};
use sandkasten_types::{MicrovmSettings, TemplateLayers};
use sha2::{Digest, Sha256};

use super::images::{Staging, mark_used, prune_unused, run};
use crate::error::RuntimeError;

/// Where a template layer's files are, inside its layer directory (the template directory).
const LAYER_ROOT: &str = "opt";

/// How long an image no VM started from is kept.
const UNUSED: std::time::Duration = std::time::Duration::from_secs(3600);

/// Merges the overlay of the layers (`$1`, overlay's options) at `$2` and copies it into the ext4 image `$3`,
/// without the `lost+found` mkfs adds (the guest's `/opt` shows what the template holds, as on the process tier).
const MERGE_AND_FORMAT: &str = "mount -t overlay -o \"ro,$1\" sandkasten-template \"$2\" && \
     mkfs.ext4 -q -F -O ^has_journal -L sandkasten-tpl -E root_owner=0:0 -d \"$2\" \"$3\" && \
     debugfs -w -R 'rmdir lost+found' \"$3\" >/dev/null 2>&1";

/// The disk image of `layers` (built now if no VM has used it yet); `None` for a sandbox without a built template.
pub(crate) fn template_image(
    settings: &MicrovmSettings,
    layers: &TemplateLayers,
) -> Result<Option<PathBuf>, RuntimeError> {
    if layers.layers.is_empty() {
        return Ok(None);
    }
    let dir = settings.dir.join("templates");
    let image = dir.join(format!("template-{}.ext4", key_of(&layers.layers)));
    if image.is_file() {
        mark_used(&image);
        return Ok(Some(image));
    }
    prune_unused(&dir, "template-", UNUSED);
    std::fs::create_dir_all(&dir).map_err(|e| RuntimeError::sys_owned(format!("creating {}", dir.display()), e))?;
    let staging = Staging(dir.join(format!(".build-{}-{}", std::process::id(), crate::ids::new_sandbox_id()?)));
    let (empty, merged) = (staging.0.join("empty"), staging.0.join("merged"));
    for path in [&staging.0, &empty, &merged] {
        std::fs::create_dir(path).map_err(|e| RuntimeError::sys_owned(format!("creating {}", path.display()), e))?;
    }
    let lower = overlay_options(&layers.layers, &empty)?;
    let built = staging.0.join("template.ext4");
    let file = std::fs::File::create(&built).map_err(|e| RuntimeError::sys("creating the template image", e))?;
    file.set_len(image_bytes(&layers.layers)).map_err(|e| RuntimeError::sys("sizing the template image", e))?;
    drop(file);
    let args: Vec<&std::ffi::OsStr> = vec![
        "--mount".as_ref(),
        "--propagation".as_ref(),
        "private".as_ref(),
        "sh".as_ref(),
        "-c".as_ref(),
        MERGE_AND_FORMAT.as_ref(),
        "sh".as_ref(),
        lower.as_ref(),
        merged.as_os_str(),
        built.as_os_str(),
    ];
    run("unshare", &args, "building the template's microVM image")?;
    std::fs::rename(&built, &image).map_err(|e| RuntimeError::sys("placing the template image", e))?;
    Ok(Some(image))
}

/// The cache key of `layers`: their paths name their content (each layer directory is its digest).
fn key_of(layers: &[PathBuf]) -> String {
    let mut hash = Sha256::new();
    for layer in layers {
        hash.update(layer.as_os_str().as_encoded_bytes());
        hash.update(b"\n");
    }
    hash.finalize().iter().take(16).map(|byte| format!("{byte:02x}")).collect()
}

/// Overlay's options for `layers` over `empty`, as every tier mounts them (`sandkasten_jail::rootfs`); a path
/// overlay options cannot name is refused.
fn overlay_options(layers: &[PathBuf], empty: &Path) -> Result<String, RuntimeError> {
    let lowers = template_lowers(layers, &RealHostFs);
    read_only_overlay_options(&lowers, empty)
        .map_err(|bad| RuntimeError::InvalidInput(format!("template layer {} holds ':', ',' or '\\'", bad.display())))
}

/// The image's size: what the layers hold (each file rounded up to a block, and a block per entry), a fifth more
/// for ext4's own structures, and 16 MiB. Sparse: only what mkfs writes takes host disk.
fn image_bytes(layers: &[PathBuf]) -> u64 {
    let held: u64 = layers.iter().map(|layer| tree_bytes(&layer.join(LAYER_ROOT))).sum();
    held.saturating_add(held / 5).saturating_add(16 << 20)
}

/// The bytes a tree holds, as `image_bytes` counts them (links are not followed).
fn tree_bytes(root: &Path) -> u64 {
    const BLOCK: u64 = 4096;
    let mut total = 0u64;
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        total = total.saturating_add(BLOCK).saturating_add(meta.len().div_ceil(BLOCK) * BLOCK);
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&path)
        {
            pending.extend(entries.flatten().map(|entry| entry.path()));
        }
    }
    total
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_key_names_the_layers_in_order() {
        let (a, b) = (PathBuf::from("/t/layers/aa"), PathBuf::from("/t/layers/bb"));
        assert_eq!(key_of(&[a.clone(), b.clone()]), key_of(&[a.clone(), b.clone()]));
        assert_ne!(key_of(&[a.clone(), b.clone()]), key_of(&[b, a.clone()]));
        assert_ne!(key_of(std::slice::from_ref(&a)), key_of(&[a.clone(), a.clone()]));
        assert_eq!(key_of(&[a]).len(), 32);
    }

    #[test]
    fn the_overlay_puts_the_topmost_layer_first_and_the_empty_directory_last() {
        let root = tempfile::tempdir().unwrap();
        let layer = |name: &str| {
            let path = root.path().join(name);
            std::fs::create_dir_all(path.join(LAYER_ROOT)).unwrap();
            path
        };
        let (bottom, top) = (layer("bottom"), layer("top"));
        let empty = root.path().join("empty");
        let options = overlay_options(&[bottom.clone(), top.clone()], &empty).unwrap();
        let expected = format!("userxattr,lowerdir={}/opt:{}/opt:{}", top.display(), bottom.display(), empty.display());
        assert_eq!(options, expected);
        let odd = layer("a:b");
        assert!(overlay_options(&[odd], &empty).is_err(), "a ':' in a layer path cannot be named to overlay");
    }

    /// A layer is what a build step's (untrusted) code left: a link in it to a host file must reach the image as a
    /// link, never as the host file's bytes (the merge runs as the host's root), and whiteouts hide what they name.
    #[test]
    fn a_layers_links_to_host_files_stay_links_and_whiteouts_hide_the_file() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: building a template image mounts an overlay (needs root)");
            return;
        }
        let host = tempfile::tempdir().unwrap();
        let canary = host.path().join("canary");
        let secret = format!("host-canary-{}", std::process::id());
        std::fs::write(&canary, &secret).unwrap();
        let root = tempfile::tempdir().unwrap();
        let (bottom, top) = (root.path().join("bottom"), root.path().join("top"));
        std::fs::create_dir_all(bottom.join(LAYER_ROOT)).unwrap();
        std::fs::create_dir_all(top.join(LAYER_ROOT)).unwrap();
        std::os::unix::fs::symlink(&canary, bottom.join("opt/canary-link")).unwrap();
        std::fs::write(bottom.join("opt/removed"), "removed").unwrap();
        std::fs::write(bottom.join("opt/kept"), "kept").unwrap();
        // The top layer deletes `removed`: an overlay whiteout, a 0:0 character device.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            top.join("opt/removed"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::empty(),
            0,
        )
        .unwrap();
        let settings = MicrovmSettings { dir: root.path().join("microvm"), ..MicrovmSettings::default() };
        let layers = TemplateLayers { layers: vec![bottom, top], ..TemplateLayers::default() };
        let image = template_image(&settings, &layers).unwrap().unwrap();
        let bytes = std::fs::read(&image).unwrap();
        let holds = |needle: &[u8]| bytes.windows(needle.len()).any(|window| window == needle);
        assert!(!holds(secret.as_bytes()), "the host file's bytes are in the template image");
        assert!(holds(canary.as_os_str().as_encoded_bytes()), "the link's target is kept as a link");
        assert!(holds(b"kept") && !holds(b"removed"), "the whiteout hides `removed`");
        assert_eq!(template_image(&settings, &layers).unwrap(), Some(image), "the second use takes the cached image");
        let mounted = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounted.contains(&root.path().display().to_string()), "the merge left a mount: {mounted}");
    }

    #[test]
    fn the_image_holds_what_the_layers_hold_with_room() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("l/opt/d")).unwrap();
        std::fs::write(root.path().join("l/opt/d/f"), vec![0u8; 10_000]).unwrap();
        let bytes = image_bytes(&[root.path().join("l")]);
        assert!(bytes >= (16 << 20) + 12_288 + 3 * 4096, "{bytes}");
    }
}
