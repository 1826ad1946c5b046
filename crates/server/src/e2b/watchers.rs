//! The facade's non-streaming directory watchers (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`: what the sync
//! SDK's `files.watch_dir` polls): each holds the events its runtime watch delivered since the last poll, at most
//! `MAX_PENDING_EVENTS` (the oldest are dropped first), in the server's memory. A watcher ends with its sandbox
//! (`Sessions::close`), when removed, or when its directory goes away (then its last events are still answered).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::task::AbortHandle;

/// Most events one watcher holds between two polls.
pub(crate) const MAX_PENDING_EVENTS: usize = 4096;

/// What a watcher has collected.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// Events since the last poll, oldest first, as the answer shows them (envd's `FilesystemEvent`s).
    pub(crate) events: VecDeque<Value>,
    /// Its watch ended (its directory went away): after these events there will be none.
    pub(crate) ended: bool,
}

impl Pending {
    /// Adds events, dropping the oldest beyond the bound.
    pub(crate) fn push(&mut self, events: Vec<Value>) {
        self.events.extend(events);
        let excess = self.events.len().saturating_sub(MAX_PENDING_EVENTS);
        self.events.drain(..excess);
    }
}

#[derive(Debug)]
struct Watcher {
    sandbox: String,
    pending: Arc<Mutex<Pending>>,
    /// The task feeding `pending`; aborting it drops the runtime watch's receiver, which stops the watch.
    feeder: AbortHandle,
}

/// Every facade watcher, by watcher id.
#[derive(Debug, Default)]
pub(crate) struct Watchers {
    by_id: Mutex<HashMap<String, Watcher>>,
}

impl Watchers {
    /// Records watcher `id` of sandbox `sandbox`, fed by `feeder` into `pending`.
    pub(crate) fn insert(&self, id: String, sandbox: &str, pending: Arc<Mutex<Pending>>, feeder: AbortHandle) {
        let watcher = Watcher { sandbox: sandbox.to_owned(), pending, feeder };
        self.by_id.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(id, watcher);
    }

    /// Takes watcher `id`'s events (it must be sandbox `sandbox`'s): `None` when there is no such watcher, else the
    /// events and whether its watch has ended.
    pub(crate) fn take(&self, sandbox: &str, id: &str) -> Option<(Vec<Value>, bool)> {
        let watchers = self.by_id.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let watcher = watchers.get(id).filter(|watcher| watcher.sandbox == sandbox)?;
        let mut pending = watcher.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Some((pending.events.drain(..).collect(), pending.ended))
    }

    /// Removes watcher `id` of sandbox `sandbox`; false when there was none.
    pub(crate) fn remove(&self, sandbox: &str, id: &str) -> bool {
        let mut watchers = self.by_id.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if watchers.get(id).is_none_or(|watcher| watcher.sandbox != sandbox) {
            return false;
        }
        if let Some(watcher) = watchers.remove(id) {
            watcher.feeder.abort();
        }
        true
    }

    /// Removes every watcher of sandbox `sandbox` (it ended).
    pub(crate) fn close_sandbox(&self, sandbox: &str) {
        let mut watchers = self.by_id.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        watchers.retain(|_, watcher| {
            let keep = watcher.sandbox != sandbox;
            if !keep {
                watcher.feeder.abort();
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: usize) -> Value {
        serde_json::json!({ "name": n.to_string(), "type": "EVENT_TYPE_CREATE" })
    }

    #[test]
    fn pending_events_are_bounded_dropping_the_oldest() {
        let mut pending = Pending::default();
        pending.push((0..MAX_PENDING_EVENTS + 10).map(event).collect());
        assert_eq!(pending.events.len(), MAX_PENDING_EVENTS);
        assert_eq!(pending.events.front(), Some(&event(10)));
    }
}
