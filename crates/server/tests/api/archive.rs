//! Tar archives: upload then download gives back the same tree; every tar-slip variant (`..`, absolute names, a
//! symlink then a path through it, hard links, devices) is refused with 400 naming the entry and writes nothing;
//! size limits are 413 both ways; another tenant gets 404.

use axum::body::Body;
use serde_json::json;
use tar::{EntryType, Header};

use crate::harness::{Harness, KEY_A, KEY_B, MAX_FILE_BYTES};

fn header(kind: EntryType, size: u64) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(0o644);
    header
}

/// An archive written header by header with raw names (the tar crate refuses to write `..` or absolute names
/// itself); `link` is the link target of symlinks and hard links.
fn raw_archive(entries: &[(&str, EntryType, &[u8], &str)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, kind, data, link) in entries {
        let mut header = header(*kind, data.len() as u64);
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        if !link.is_empty() {
            header.set_link_name(link).unwrap();
        }
        header.set_cksum();
        builder.append(&header, *data).unwrap();
    }
    builder.into_inner().unwrap()
}

/// Entries of a tar: (name, kind, bytes).
fn entries(tar: &[u8]) -> Vec<(String, EntryType, Vec<u8>)> {
    let mut archive = tar::Archive::new(tar);
    let mut out = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
        let kind = entry.header().entry_type();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
        out.push((name.trim_end_matches('/').to_owned(), kind, data));
    }
    out
}

fn binary() -> Vec<u8> {
    (0..=255u8).cycle().take(5000).collect()
}

#[tokio::test]
async fn upload_then_download_gives_back_the_same_entries_and_bytes() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let tar = raw_archive(&[
        ("./", EntryType::Directory, b"", ""),
        ("./top.txt", EntryType::Regular, b"hello\n", ""),
        ("nested/", EntryType::Directory, b"", ""),
        ("nested/deeper/blob.bin", EntryType::Regular, &binary(), ""),
        ("empty/", EntryType::Directory, b"", ""),
    ]);
    let uri = format!("/v1/sandboxes/{id}/files/archive?path=/workspace/proj");
    let reply = h.put(&uri, KEY_A, &tar).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json(), json!({"files": 2, "directories": 3, "bytes": 5006}));
    let read = h.get(&format!("/v1/sandboxes/{id}/files?path=/workspace/proj/nested/deeper/blob.bin"), KEY_A).await;
    assert_eq!(read.body, binary());

    let download = h.get(&uri, KEY_A).await;
    assert_eq!(download.status, 200, "{}", download.text());
    assert_eq!(download.headers["content-type"], "application/x-tar");
    let mut got = entries(&download.body);
    got.sort_by(|a, b| a.0.cmp(&b.0));
    let expected = vec![
        ("empty".to_owned(), EntryType::Directory, vec![]),
        ("nested".to_owned(), EntryType::Directory, vec![]),
        ("nested/deeper".to_owned(), EntryType::Directory, vec![]),
        ("nested/deeper/blob.bin".to_owned(), EntryType::Regular, binary()),
        ("top.txt".to_owned(), EntryType::Regular, b"hello\n".to_vec()),
    ];
    assert_eq!(got, expected);

    // Uploading the download elsewhere reproduces the tree.
    let copy = format!("/v1/sandboxes/{id}/files/archive?path=/tmp/copy/");
    assert_eq!(h.put(&copy, KEY_A, &download.body).await.json()["bytes"], 5006);
    let (files, _) = h.runtime.tree(&id);
    assert_eq!(files["/tmp/copy/nested/deeper/blob.bin"], binary());

    // One file: a tar holding just that file under its base name.
    let single = h.get(&format!("/v1/sandboxes/{id}/files/archive?path=/workspace/proj/top.txt"), KEY_A).await;
    assert_eq!(entries(&single.body), vec![("top.txt".to_owned(), EntryType::Regular, b"hello\n".to_vec())]);
}

#[tokio::test]
async fn tar_slip_variants_are_refused_by_name_and_write_nothing() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let uri = format!("/v1/sandboxes/{id}/files/archive?path=/workspace/dst");
    let before = h.runtime.tree(&id);
    let ok: (&str, EntryType, &[u8], &str) = ("fine.txt", EntryType::Regular, b"ok", "");
    let variants: Vec<(&str, Vec<u8>)> = vec![
        ("../evil", raw_archive(&[ok, ("../evil", EntryType::Regular, b"x", "")])),
        ("/etc/evil", raw_archive(&[ok, ("/etc/evil", EntryType::Regular, b"x", "")])),
        ("a/../../evil", raw_archive(&[ok, ("a/../../evil", EntryType::Regular, b"x", "")])),
        (
            "link",
            raw_archive(&[
                ok,
                ("link", EntryType::Symlink, b"", "/etc"),
                ("link/passwd", EntryType::Regular, b"x", ""),
            ]),
        ),
        ("passwd", raw_archive(&[ok, ("passwd", EntryType::Link, b"", "/etc/passwd")])),
        ("null", raw_archive(&[ok, ("null", EntryType::Char, b"", "")])),
        ("pipe", raw_archive(&[ok, ("pipe", EntryType::Fifo, b"", "")])),
    ];
    for (entry, tar) in variants {
        let message = h.put(&uri, KEY_A, &tar).await.assert_error(400, "bad_request");
        assert!(message.contains(&format!("{entry:?}")), "{entry}: {message}");
        assert_eq!(h.runtime.tree(&id), before, "{entry}: the archive must not write anything");
    }
    let gzip = h.put(&uri, KEY_A, &[0x1f, 0x8b, 8, 0, 0, 0]).await.assert_error(400, "bad_request");
    assert!(gzip.contains("gzip"), "{gzip}");
    h.put(&uri, KEY_A, &[b'x'; 1024]).await.assert_error(400, "bad_request");
    for bad in ["relative", "/workspace/../etc", "/a%00b"] {
        let reply = h.put(&format!("/v1/sandboxes/{id}/files/archive?path={bad}"), KEY_A, &raw_archive(&[ok])).await;
        reply.assert_error(400, "bad_request");
        h.get(&format!("/v1/sandboxes/{id}/files/archive?path={bad}"), KEY_A).await.assert_error(400, "bad_request");
    }
    assert_eq!(h.runtime.tree(&id), before);
}

#[tokio::test]
async fn oversized_archives_are_413_both_ways() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    let uri = format!("/v1/sandboxes/{id}/files/archive?path=/workspace");
    let big = vec![7u8; MAX_FILE_BYTES as usize];
    let tar = raw_archive(&[("big.bin", EntryType::Regular, &big, "")]);
    let message = h.put(&uri, KEY_A, &tar).await.assert_error(413, "payload_too_large");
    assert!(message.contains(&MAX_FILE_BYTES.to_string()), "{message}");
    assert!(h.runtime.tree(&id).0.is_empty());

    // Each file fits, together they do not.
    let third = vec![1u8; MAX_FILE_BYTES as usize / 3 + 1];
    for name in ["a", "b", "c"] {
        assert_eq!(h.put(&format!("/v1/sandboxes/{id}/files?path=/workspace/{name}"), KEY_A, &third).await.status, 204);
    }
    h.get(&uri, KEY_A).await.assert_error(413, "payload_too_large");
    let missing = format!("/v1/sandboxes/{id}/files/archive?path=/workspace/nope");
    h.get(&missing, KEY_A).await.assert_error(404, "not_found");
}

#[tokio::test]
async fn another_tenant_gets_404_and_changes_nothing() {
    let h = Harness::new();
    let id = h.create(KEY_A, json!({})).await;
    assert_eq!(h.put(&format!("/v1/sandboxes/{id}/files?path=/workspace/secret"), KEY_A, b"s3cret").await.status, 204);
    let before = h.runtime.tree(&id);
    let tar = raw_archive(&[("secret", EntryType::Regular, b"overwritten", "")]);
    for target in [id.as_str(), "sb-0123456789abcdef"] {
        let uri = format!("/v1/sandboxes/{target}/files/archive?path=/workspace");
        let message = h.call("PUT", &uri, Some(KEY_B), Body::from(tar.clone())).await.assert_error(404, "not_found");
        assert_eq!(message, format!("sandbox {target} not found"));
        h.get(&uri, KEY_B).await.assert_error(404, "not_found");
    }
    assert_eq!(h.runtime.tree(&id), before);
}
