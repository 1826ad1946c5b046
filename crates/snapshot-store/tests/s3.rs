//! The store's behaviour (`cases`) through `s3://` against a real S3-compatible server: moto's `moto_server`,
//! started by this test on loopback (a port of its own choosing), with one bucket and a prefix per case, and killed
//! at the end.
//!
//! The server comes from `scripts/setup-s3-test-server.sh` (run by `scripts/setup.sh`, so by CI). Where it is not
//! installed the test says so and skips — except under CI (`CI` set), where a missing server fails the test, so a
//! broken install cannot pass as a green run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod moto;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cases::Harness;
use moto::MotoServer;
use object_store::aws::AmazonS3Builder;
use object_store::prefix::PrefixStore;
use sandkasten_snapshot_store::{S3Options, SnapshotStore, StoreConfig};

const BUCKET: &str = "sandkasten-snapshots";

/// Store settings for the moto server: path-style requests to the loopback endpoint, throwaway keys.
fn s3_options(server: &MotoServer) -> S3Options {
    S3Options {
        endpoint: Some(server.endpoint()),
        region: Some("us-east-1".to_owned()),
        access_key_id: Some("testing".to_owned()),
        secret_access_key: Some("testing".to_owned()),
        allow_http: true,
    }
}

/// A harness for one case: its own prefix in the bucket.
fn harness(server: &MotoServer, case: &str) -> Harness {
    let options = s3_options(server);
    let config = StoreConfig { url: format!("s3://{BUCKET}/{case}"), s3: options.clone(), gc_grace: Duration::ZERO };
    // Opening installs the TLS crypto provider the raw client below needs too.
    SnapshotStore::open(&config).unwrap();
    let raw = AmazonS3Builder::new()
        .with_bucket_name(BUCKET)
        .with_endpoint(server.endpoint())
        .with_region("us-east-1")
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .with_allow_http(true)
        .build()
        .unwrap();
    Harness { config, raw: Arc::new(PrefixStore::new(raw, case)) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_store_passes_every_case_against_a_real_server() {
    let server = match MotoServer::start() {
        Ok(server) => server,
        Err(reason) if std::env::var_os("CI").is_some() => panic!("{reason}"),
        Err(reason) => {
            println!("skipped: {reason}");
            return;
        }
    };
    server.create_bucket(BUCKET);
    for (name, case) in cases::ALL {
        println!("case {name}");
        case(&harness(&server, name)).await;
    }

    let pid = server.child.id();
    drop(server);
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "moto_server {pid} is still there after the test");
}
