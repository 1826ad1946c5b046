//! The store's behaviour (`cases`) on a local directory, one test per case.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;

use std::sync::Arc;
use std::time::Duration;

use cases::Harness;
use object_store::local::LocalFileSystem;
use sandkasten_snapshot_store::{S3Options, StoreConfig};

/// Runs the case `name` on a fresh directory.
async fn run(name: &str) {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("snapshots");
    let config =
        StoreConfig { url: format!("file://{}", dir.display()), s3: S3Options::default(), gc_grace: Duration::ZERO };
    // Opening creates the directory, which the raw handle needs.
    sandkasten_snapshot_store::SnapshotStore::open(&config).unwrap();
    let harness = Harness { config, raw: Arc::new(LocalFileSystem::new_with_prefix(&dir).unwrap()) };
    let (_, case) = cases::ALL.iter().find(|(case, _)| *case == name).unwrap();
    case(&harness).await;
}

macro_rules! local_cases {
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                run(stringify!($name)).await;
            }
        )*

        #[test]
        fn every_case_runs_locally() {
            let here = [$(stringify!($name)),*];
            for (name, _) in cases::ALL {
                assert!(here.contains(name), "case {name} has no local test");
            }
        }
    };
}

local_cases!(
    empty_one_byte_and_multi_chunk_parts_round_trip,
    the_input_is_read_at_most_a_few_chunks_ahead_of_what_is_stored,
    a_corrupted_chunk_is_named_with_snapshot_and_part,
    a_missing_chunk_is_named_with_snapshot_and_part,
    a_put_failing_half_way_leaves_no_manifest_and_gc_removes_its_chunks,
    deleting_one_of_two_snapshots_keeps_the_shared_chunks,
    two_tars_that_differ_a_little_share_most_chunks,
    gc_keeps_orphans_younger_than_the_grace_period,
    gc_spares_orphan_chunks_a_put_in_progress_reuses,
    an_old_orphan_a_put_reuses_survives_another_processs_gc,
    ids_duplicates_and_unknown_snapshots_are_refused,
    a_damaged_manifest_stops_gc_before_it_deletes,
);
