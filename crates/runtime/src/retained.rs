//! Output the server holds in its own memory (root, outside every sandbox's cgroup) is bounded twice: each stream of
//! each command by the sandbox's `limits.output_bytes`, and all output held for one sandbox, and for one tenant,
//! by an `OutputBudget`. A budget is charged as bytes are kept and credited when they are dropped (`Held`), so it
//! bounds what is held at once, not what a sandbox ever printed. A budget may have a parent (the sandbox's
//! tenant): a charge takes from both, and what either lacks is not kept (the stream is marked truncated).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A bound on the output bytes held at once, optionally inside a parent bound.
#[derive(Debug)]
pub struct OutputBudget {
    limit: u64,
    used: AtomicU64,
    parent: Option<Arc<OutputBudget>>,
}

impl OutputBudget {
    /// A budget of `limit` bytes; charges also take from `parent`.
    pub fn new(limit: u64, parent: Option<Arc<OutputBudget>>) -> Arc<OutputBudget> {
        Arc::new(OutputBudget { limit, used: AtomicU64::new(0), parent })
    }

    /// The bound, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held under this budget now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Takes up to `wanted` bytes from this budget alone; returns how many.
    fn take_own(&self, wanted: u64) -> u64 {
        let mut granted = 0;
        let _ = self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            granted = wanted.min(self.limit.saturating_sub(used));
            Some(used + granted)
        });
        granted
    }

    /// Takes up to `wanted` bytes (as many as this budget and every parent have room for); returns how many.
    fn take(&self, wanted: u64) -> u64 {
        let own = self.take_own(wanted);
        let granted = match &self.parent {
            Some(parent) => parent.take(own),
            None => own,
        };
        self.used.fetch_sub(own - granted, Ordering::AcqRel);
        granted
    }

    /// Credits `bytes` back to this budget and every parent.
    fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes.min(self.used()), Ordering::AcqRel);
        if let Some(parent) = &self.parent {
            parent.give_back(bytes);
        }
    }
}

/// Bytes held under a budget by one holder (a command's retained output, one answer being built); credited back
/// when dropped.
#[derive(Debug)]
pub struct Held {
    budget: Arc<OutputBudget>,
    bytes: u64,
}

impl Held {
    /// Nothing held yet under `budget`.
    pub fn new(budget: Arc<OutputBudget>) -> Held {
        Held { budget, bytes: 0 }
    }

    /// Charges up to `wanted` more bytes; returns how many may be kept.
    pub fn take(&mut self, wanted: u64) -> u64 {
        let granted = self.budget.take(wanted);
        self.bytes += granted;
        granted
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// What a background command's retained output may hold: `per_stream` bytes of each stream, all of it charged to
/// `budget` (the sandbox's).
#[derive(Debug, Clone)]
pub struct OutputRetention {
    /// The sandbox's `limits.output_bytes`.
    pub per_stream: u64,
    /// The sandbox's budget.
    pub budget: Arc<OutputBudget>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_is_bounded_by_the_budget_and_its_parent_and_credited_on_drop() {
        let tenant = OutputBudget::new(100, None);
        let first = OutputBudget::new(80, Some(Arc::clone(&tenant)));
        let second = OutputBudget::new(80, Some(Arc::clone(&tenant)));
        let mut a = Held::new(Arc::clone(&first));
        assert_eq!(a.take(50), 50);
        assert_eq!(a.take(50), 30, "the sandbox's own bound");
        let mut b = Held::new(Arc::clone(&second));
        assert_eq!(b.take(50), 20, "the tenant's bound");
        assert_eq!((first.used(), second.used(), tenant.used()), (80, 20, 100));
        drop(a);
        assert_eq!((first.used(), tenant.used()), (0, 20));
        assert_eq!(b.take(100), 60);
        drop(b);
        assert_eq!((second.used(), tenant.used()), (0, 0));
    }
}
