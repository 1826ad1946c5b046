//! What keeps a built template's layers from a removal between a create choosing the template and its sandbox's row
//! naming them. A create holds a read lock (`Choosing`) only while it reads the template's layers, then registers
//! those layers as starting (`Starting`, counted per layer) and lets the lock go: its start, however long (a restore
//! from a files snapshot can take minutes), holds off no removal and no other create. A removal holds the write lock
//! (`Removing`) while it decides, and keeps every layer that a row, a pool or a starting create names; so a create
//! either chose before the removal began (its layers are starting or recorded by then) or after it ended (the
//! template is gone and the create is refused naming it).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// Layers of creates that chose a template and whose sandbox's row may not name them yet, with how many creates.
type StartingLayers = Arc<Mutex<HashMap<PathBuf, usize>>>;

/// The server's one instance (in `AppState`); cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct TemplateUse {
    lock: Arc<RwLock<()>>,
    starting: StartingLayers,
}

impl TemplateUse {
    /// Held by a create while it chooses a template and reads its layers; `Choosing::starting` then registers them.
    pub(crate) async fn choosing(&self) -> Choosing {
        Choosing { _read: Arc::clone(&self.lock).read_owned().await, starting: Arc::clone(&self.starting) }
    }

    /// Holds off removals while held (the pools' refill while it switches a pool to a rebuilt template's layers:
    /// a pool's layers are read from the pool itself, never registered).
    pub(crate) async fn holding(&self) -> OwnedRwLockReadGuard<()> {
        Arc::clone(&self.lock).read_owned().await
    }

    /// Held by a removal while it finds the layers still needed and removes the rest.
    pub(crate) async fn removing(&self) -> Removing {
        Removing { _write: Arc::clone(&self.lock).write_owned().await, starting: Arc::clone(&self.starting) }
    }
}

/// A create choosing a template (a read lock).
#[derive(Debug)]
pub(crate) struct Choosing {
    _read: OwnedRwLockReadGuard<()>,
    starting: StartingLayers,
}

impl Choosing {
    /// The create chose `layers`: they count as used until the returned value is dropped (once the sandbox's row
    /// names them, or the start failed), and the lock goes now.
    pub(crate) fn starting(self, layers: &[PathBuf]) -> Starting {
        let mut starting = self.starting.lock().unwrap_or_else(PoisonError::into_inner);
        for layer in layers {
            *starting.entry(layer.clone()).or_default() += 1;
        }
        drop(starting);
        Starting { layers: layers.to_vec(), starting: Arc::clone(&self.starting) }
    }
}

/// The layers of one starting create; released on drop.
#[derive(Debug)]
pub(crate) struct Starting {
    layers: Vec<PathBuf>,
    starting: StartingLayers,
}

impl Drop for Starting {
    fn drop(&mut self) {
        let mut starting = self.starting.lock().unwrap_or_else(PoisonError::into_inner);
        for layer in &self.layers {
            if let Some(count) = starting.get_mut(layer) {
                *count -= 1;
                if *count == 0 {
                    starting.remove(layer);
                }
            }
        }
    }
}

/// A removal deciding (the write lock: no create is choosing meanwhile).
#[derive(Debug)]
pub(crate) struct Removing {
    _write: OwnedRwLockWriteGuard<()>,
    starting: StartingLayers,
}

impl Removing {
    /// The layers of the creates that chose their template before this removal began and may not be recorded yet.
    pub(crate) fn starting_layers(&self) -> HashSet<PathBuf> {
        self.starting.lock().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn layers(names: &[&str]) -> Vec<PathBuf> {
        names.iter().map(PathBuf::from).collect()
    }

    #[tokio::test]
    async fn a_starting_creates_layers_are_kept_until_it_is_dropped_counted_per_create() {
        let used = TemplateUse::default();
        let first = used.choosing().await.starting(&layers(&["a", "b"]));
        let second = used.choosing().await.starting(&layers(&["b", "c"]));
        let seen = |removing: &Removing| {
            let mut seen: Vec<_> = removing.starting_layers().into_iter().collect();
            seen.sort();
            seen
        };
        {
            let removing = used.removing().await;
            assert_eq!(seen(&removing), layers(&["a", "b", "c"]), "a starting create holds off no removal");
        }
        drop(first);
        assert_eq!(seen(&used.removing().await), layers(&["b", "c"]), "b is still the second create's");
        drop(second);
        assert!(used.removing().await.starting_layers().is_empty());
    }

    #[tokio::test]
    async fn a_removal_waits_for_a_create_choosing_and_then_sees_its_layers() {
        let used = TemplateUse::default();
        let choosing = used.choosing().await;
        let removal = tokio::spawn({
            let used = used.clone();
            async move { used.removing().await.starting_layers() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!removal.is_finished(), "a removal decided while a create was choosing");
        let _starting = choosing.starting(&layers(&["a"]));
        assert_eq!(removal.await.unwrap(), HashSet::from([PathBuf::from("a")]));
    }

    #[tokio::test]
    async fn a_create_waits_for_a_removal_deciding() {
        let used = TemplateUse::default();
        let removing = used.removing().await;
        let create = tokio::spawn({
            let used = used.clone();
            async move { drop(used.choosing().await.starting(&layers(&["a"]))) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!create.is_finished(), "a create chose while a removal was deciding");
        drop(removing);
        create.await.unwrap();
    }
}
