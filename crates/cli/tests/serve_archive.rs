//! End to end against a real `sandkasten serve`: a tar made by the host's `/usr/bin/tar` unpacks inside the sandbox
//! (the program sees the files), tar-slip archives (absolute names, `..`, links) are refused and leave nothing on
//! the host or in the sandbox, and the download is a tar that `/usr/bin/tar` lists and unpacks, with symlinks
//! stored as links (a link to `/` is not followed).
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::path::Path;
use std::process::Command;

use common::Tier;
use serde_json::json;
use serve::{KEY_1, Server, assert_sandbox_gone_on};

per_tier!(host_tar_uploads_downloads_and_tar_slip_is_refused, sandbox_cp_copies_directories_both_ways,);

fn tar(args: &[&str], dir: &Path) -> String {
    let output = Command::new("/usr/bin/tar").args(args).current_dir(dir).output().expect("run /usr/bin/tar");
    assert!(output.status.success(), "tar {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn blob() -> Vec<u8> {
    (0..=255u8).cycle().take(200_000).collect()
}

fn host_tar_uploads_downloads_and_tar_slip_is_refused(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let host = tempfile::tempdir().unwrap();
    let root = host.path();
    std::fs::create_dir_all(root.join("proj/sub/deep")).unwrap();
    std::fs::create_dir_all(root.join("proj/empty")).unwrap();
    std::fs::write(root.join("proj/a.txt"), "hello archive\n").unwrap();
    std::fs::write(root.join("proj/sub/deep/data.bin"), blob()).unwrap();
    tar(&["-cf", "up.tar", "proj"], root);

    let upload = std::fs::read(root.join("up.tar")).unwrap();
    let put = server.put_bytes(&format!("/v1/sandboxes/{id}/files/archive?path=/workspace"), KEY_1, &upload);
    assert_eq!(put.status, 200, "{put:?}");
    assert_eq!((put.json["files"].as_u64(), put.json["bytes"].as_u64()), (Some(2), Some(200_014)), "{put:?}");
    let listing = server.exec(&id, "cd /workspace/proj && ls -laR && wc -c < sub/deep/data.bin && cat a.txt");
    let stdout = listing.json["stdout"].as_str().unwrap();
    for expected in ["a.txt", "data.bin", "empty", "200000\n", "hello archive\n"] {
        assert!(stdout.contains(expected), "{expected:?} missing from the sandbox's view: {stdout}");
    }

    // Tar-slip: an absolute host path, `../`, a symlink then a path through it, a hard link. Each archive has a
    // harmless first entry, which must not be written either.
    let marker = root.join("escaped-abs");
    std::fs::write(&marker, "x").unwrap();
    std::fs::create_dir_all(root.join("inner")).unwrap();
    std::fs::write(root.join("escaped-up"), "x").unwrap();
    std::fs::write(root.join("inner/first.txt"), "x").unwrap();
    std::os::unix::fs::symlink("/etc", root.join("inner/link")).unwrap();
    std::fs::hard_link(root.join("inner/first.txt"), root.join("inner/hard")).unwrap();
    let marker_name = marker.to_str().unwrap();
    tar(&["-P", "-cf", "../abs.tar", "first.txt", marker_name], &root.join("inner"));
    tar(&["-P", "-cf", "../up.tar", "first.txt", "../escaped-up"], &root.join("inner"));
    tar(&["-cf", "../link.tar", "first.txt", "link", "link/passwd"], &root.join("inner"));
    tar(&["-cf", "../hard.tar", "first.txt", "hard"], &root.join("inner"));
    std::fs::remove_file(&marker).unwrap();
    std::fs::remove_file(root.join("escaped-up")).unwrap();
    for (archive, entry) in
        [("abs.tar", marker_name), ("up.tar", "../escaped-up"), ("link.tar", "link"), ("hard.tar", "hard")]
    {
        let body = std::fs::read(root.join(archive)).unwrap();
        let uri = format!("/v1/sandboxes/{id}/files/archive?path=/workspace/slip/in");
        let reply = server.put_bytes(&uri, KEY_1, &body);
        assert_eq!(reply.status, 400, "{archive} must be refused: {reply:?}");
        let message = reply.json["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("{entry:?}")), "{archive}: the message names the entry: {message}");
    }
    assert!(!marker.exists() && !root.join("escaped-up").exists(), "a refused archive wrote on the host");
    let after =
        server.exec(&id, "ls -a /workspace; find /workspace /tmp \\( -name 'escaped-*' -o -name first.txt \\) 2>&1");
    assert_eq!(after.json["stdout"], ".\n..\nproj\n", "a refused archive wrote in the sandbox: {after:?}");

    // Download: symlinks stay links (the one to / is not followed), the rest comes back byte for byte.
    let links = server.exec(&id, "ln -s /etc/passwd /workspace/proj/passwd-link; ln -s / /workspace/proj/root-link");
    assert_eq!(links.json["exit_code"], 0, "{links:?}");
    let get = server.call("GET", &format!("/v1/sandboxes/{id}/files/archive?path=/workspace/proj"), KEY_1, None);
    assert_eq!(get.status, 200, "{get:?}");
    std::fs::write(root.join("down.tar"), &get.body).unwrap();
    let listed = tar(&["-tvf", "down.tar"], root);
    for expected in ["a.txt", "sub/deep/data.bin", "empty", "passwd-link -> /etc/passwd", "root-link -> /\n"] {
        assert!(listed.contains(expected), "{expected:?} missing from the download: {listed}");
    }
    assert_eq!(listed.lines().count(), 7, "{listed}");
    std::fs::create_dir(root.join("out")).unwrap();
    tar(&["-xf", "../down.tar"], &root.join("out"));
    assert_eq!(std::fs::read(root.join("out/sub/deep/data.bin")).unwrap(), blob());

    server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_sandbox_gone_on(tier, &id);
}

fn sandbox_cp(server: &Server, from: &str, to: &str) -> std::process::Output {
    Command::new(common::bin())
        .args(["sandbox", "cp", from, to])
        .env("SANDKASTEN_URL", &server.url)
        .env("SANDKASTEN_API_KEY", KEY_1)
        .output()
        .expect("run sandkasten sandbox cp")
}

fn sandbox_cp_copies_directories_both_ways(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let host = tempfile::tempdir().unwrap();
    let src = host.path().join("src");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    std::fs::write(src.join("a/b/data.bin"), blob()).unwrap();
    std::fs::write(src.join("top.txt"), "top\n").unwrap();
    let up = sandbox_cp(&server, src.to_str().unwrap(), &format!("{id}:/workspace/"));
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    let seen = server.exec(&id, "cat /workspace/src/top.txt; wc -c < /workspace/src/a/b/data.bin");
    assert_eq!(seen.json["stdout"], "top\n200000\n", "{seen:?}");

    let link = server.exec(&id, "ln -s /etc/passwd /workspace/src/passwd-link");
    assert_eq!(link.json["exit_code"], 0, "{link:?}");
    let out = host.path().join("out");
    let down = sandbox_cp(&server, &format!("{id}:/workspace/src"), out.to_str().unwrap());
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
    assert_eq!(std::fs::read(out.join("a/b/data.bin")).unwrap(), blob());
    assert_eq!(std::fs::read_link(out.join("passwd-link")).unwrap(), Path::new("/etc/passwd"));

    // A local symlink is not followed: the server refuses it by name and nothing is unpacked.
    std::os::unix::fs::symlink("/etc", src.join("etc-link")).unwrap();
    let refused = sandbox_cp(&server, src.to_str().unwrap(), &format!("{id}:/workspace/again"));
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("etc-link"), "{refused:?}");
    assert_eq!(server.exec(&id, "ls /workspace").json["stdout"], "src\n");

    server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_sandbox_gone_on(tier, &id);
}
