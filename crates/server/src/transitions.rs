//! One transition at a time per sandbox: a pause or a resume holds the sandbox's lock for as long as it takes (a
//! filesystem pause streams the files to the store, its resume creates the sandbox anew), and requests to the sandbox
//! wait for it to settle before they look at its state, so none reaches a sandbox half paused or half resumed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

/// The per-sandbox transition locks; an entry exists only while a transition runs or waits.
#[derive(Debug, Default)]
pub(crate) struct Transitions {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A held transition of one sandbox; dropping it lets the next one run.
#[derive(Debug)]
pub(crate) struct TransitionGuard<'a> {
    transitions: &'a Transitions,
    id: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Transitions {
    fn entry(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        locks.entry(id.to_owned()).or_default().clone()
    }

    /// Waits until no other transition of sandbox `id` runs, then holds it until the guard is dropped.
    pub(crate) async fn begin(&self, id: &str) -> TransitionGuard<'_> {
        let guard = self.entry(id).lock_owned().await;
        TransitionGuard { transitions: self, id: id.to_owned(), guard: Some(guard) }
    }

    /// Waits until no transition of sandbox `id` runs (returns at once when none does).
    pub(crate) async fn settled(&self, id: &str) {
        let running = self.locks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).contains_key(id);
        if running {
            drop(self.begin(id).await);
        }
    }
}

impl Drop for TransitionGuard<'_> {
    fn drop(&mut self) {
        let mut locks = self.transitions.locks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        drop(self.guard.take());
        // Only the map's own reference is left: nobody holds or waits for this sandbox's lock.
        if locks.get(&self.id).is_some_and(|lock| Arc::strong_count(lock) == 1) {
            locks.remove(&self.id);
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_second_transition_waits_for_the_first_and_the_table_empties() {
        let transitions = Arc::new(Transitions::default());
        let first = transitions.begin("sb-1").await;
        let waiting = {
            let transitions = transitions.clone();
            tokio::spawn(async move {
                transitions.settled("sb-1").await;
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a request waits while the sandbox is in transition");
        transitions.settled("sb-2").await;
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("settled").expect("joined");
        assert!(transitions.locks.lock().expect("lock").is_empty(), "no entry is kept");
    }
}
