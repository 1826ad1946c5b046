//! In-process coordination of puts and GC, per chunk: a put *pins* each chunk it uses (found already stored or
//! uploaded) before it looks for it in the store, until its manifest is written or it gives up; GC deletes only
//! chunks that are not pinned, marking each as *being deleted* while its delete request runs.
//!
//! Why that is enough: pinning and GC's "not pinned, so mark it" happen under one lock, so for any chunk either the
//! put pinned it first (GC skips it) or GC marked it first (the put waits until the delete is done, then finds the
//! chunk absent and uploads it again). A put that commits while a collection runs hands its chunks to the collection
//! as referenced (the collection read the manifests before that commit). Neither side waits for the other's whole
//! run: a put never waits for a collection, a collection never for a put.

use std::collections::{HashMap, HashSet};
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use crate::chunk::ChunkHash;

/// The pins of one store (shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct ChunkPins {
    state: Mutex<PinState>,
    /// Woken after each delete, for puts waiting on a chunk being deleted.
    deleted: Notify,
    /// One collection at a time.
    collection: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Debug, Default)]
struct PinState {
    /// Chunks in use by puts in progress, with how many pins each holds.
    pinned: HashMap<ChunkHash, usize>,
    /// Chunks whose delete request is running.
    deleting: HashSet<ChunkHash>,
    /// Whether a collection is running.
    collecting: bool,
    /// Chunks of manifests committed since the running collection read the manifests.
    committed_during_collection: HashSet<ChunkHash>,
}

impl ChunkPins {
    fn state(&self) -> MutexGuard<'_, PinState> {
        // The state stays consistent across a panic: every change under the lock is a single insert or remove.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Pins `hash`. The caller must then [`ChunkPins::wait_while_deleting`] before looking for the chunk.
    pub(crate) fn pin(&self, hash: ChunkHash) {
        *self.state().pinned.entry(hash).or_default() += 1;
    }

    /// Returns once no delete of `hash` is running (at once, unless GC marked it before it was pinned).
    pub(crate) async fn wait_while_deleting(&self, hash: ChunkHash) {
        loop {
            let mut notified = pin!(self.deleted.notified());
            notified.as_mut().enable();
            if !self.state().deleting.contains(&hash) {
                return;
            }
            notified.await;
        }
    }

    /// Drops one pin of each of `hashes`; `committed`: their manifest is now in the store.
    fn release(&self, hashes: &[ChunkHash], committed: bool) {
        let mut state = self.state();
        for hash in hashes {
            if let Some(count) = state.pinned.get_mut(hash) {
                *count -= 1;
                if *count == 0 {
                    state.pinned.remove(hash);
                }
            }
            if committed && state.collecting {
                state.committed_during_collection.insert(*hash);
            }
        }
    }

    /// Starts a collection: waits for any other to finish. The collection ends when the guard is dropped.
    pub(crate) async fn begin_collection(self: &Arc<Self>) -> CollectionGuard {
        let exclusive = self.collection.clone().lock_owned().await;
        let mut state = self.state();
        state.collecting = true;
        state.committed_during_collection.clear();
        drop(state);
        CollectionGuard { pins: self.clone(), _exclusive: exclusive }
    }
}

/// A running collection.
pub(crate) struct CollectionGuard {
    pins: Arc<ChunkPins>,
    _exclusive: tokio::sync::OwnedMutexGuard<()>,
}

impl CollectionGuard {
    /// Marks `hash` as being deleted until the mark is dropped (after the delete request, done, failed or
    /// cancelled), unless a put holds it or committed it during this collection (`None`: keep it).
    pub(crate) fn start_deleting(&self, hash: ChunkHash) -> Option<DeletingMark<'_>> {
        let mut state = self.pins.state();
        if state.pinned.contains_key(&hash) || state.committed_during_collection.contains(&hash) {
            return None;
        }
        state.deleting.insert(hash);
        Some(DeletingMark { pins: &self.pins, hash })
    }
}

/// A chunk being deleted; dropping the mark lets puts waiting for it look again.
pub(crate) struct DeletingMark<'a> {
    pins: &'a ChunkPins,
    hash: ChunkHash,
}

impl Drop for DeletingMark<'_> {
    fn drop(&mut self) {
        self.pins.state().deleting.remove(&self.hash);
        self.pins.deleted.notify_waiters();
    }
}

impl Drop for CollectionGuard {
    fn drop(&mut self) {
        let mut state = self.pins.state();
        state.collecting = false;
        state.committed_during_collection.clear();
    }
}

/// The pins one writer holds; dropping it releases them (the put gave up), [`PinSet::release_committed`] after the
/// manifest is written.
pub(crate) struct PinSet {
    pins: Arc<ChunkPins>,
    held: Vec<ChunkHash>,
}

impl PinSet {
    pub(crate) fn new(pins: Arc<ChunkPins>) -> Self {
        PinSet { pins, held: Vec::new() }
    }

    /// Pins `hash` for this writer.
    pub(crate) fn pin(&mut self, hash: ChunkHash) -> Arc<ChunkPins> {
        self.pins.pin(hash);
        self.held.push(hash);
        self.pins.clone()
    }

    /// Releases every pin, the manifest referencing them being in the store.
    pub(crate) fn release_committed(mut self) {
        let held = std::mem::take(&mut self.held);
        self.pins.release(&held, true);
    }
}

impl Drop for PinSet {
    fn drop(&mut self) {
        self.pins.release(&self.held, false);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_pinned_chunk_is_not_deleted_and_a_deleting_one_makes_the_put_wait() {
        let pins = Arc::new(ChunkPins::default());
        let (kept, deleted) = (ChunkHash::of(b"kept"), ChunkHash::of(b"deleted"));
        let mut set = PinSet::new(pins.clone());
        set.pin(kept);
        let collection = pins.begin_collection().await;
        assert!(collection.start_deleting(kept).is_none(), "a pinned chunk was marked for deletion");
        let mark = collection.start_deleting(deleted).unwrap();

        set.pin(deleted);
        let waiter = tokio::spawn({
            let pins = pins.clone();
            async move { pins.wait_while_deleting(deleted).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "the put looked for a chunk while its delete ran");
        drop(mark);
        tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn chunks_committed_during_a_collection_are_kept_by_it() {
        let pins = Arc::new(ChunkPins::default());
        let hash = ChunkHash::of(b"committed");
        let collection = pins.begin_collection().await;
        let mut set = PinSet::new(pins.clone());
        set.pin(hash);
        set.release_committed();
        assert!(collection.start_deleting(hash).is_none());
        drop(collection);
        let next = pins.begin_collection().await;
        assert!(next.start_deleting(hash).is_some(), "the next collection reads the manifest instead");
    }

    #[tokio::test]
    async fn a_dropped_writer_releases_its_pins() {
        let pins = Arc::new(ChunkPins::default());
        let hash = ChunkHash::of(b"orphan");
        let mut set = PinSet::new(pins.clone());
        set.pin(hash);
        set.pin(hash);
        drop(set);
        assert!(pins.begin_collection().await.start_deleting(hash).is_some());
    }
}
