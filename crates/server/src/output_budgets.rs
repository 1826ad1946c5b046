//! The output budgets of sandboxes and tenants: command output the server holds in its own memory (background
//! commands' retained output, an exec or run answer being collected) is charged to its sandbox's budget
//! (`max_retained_output_bytes`) inside its tenant's (`max_output_bytes`). Budgets exist only while something holds
//! output under them: the registry keeps weak references, so a sandbox that holds nothing has no entry to leak.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use sandkasten_runtime::{Held, OutputBudget, OutputRetention};

use crate::auth::Tenant;

/// Live budgets by name, pruned of dead ones as the map grows.
#[derive(Default)]
struct Budgets {
    live: HashMap<String, Weak<OutputBudget>>,
    pruned_at: usize,
}

impl Budgets {
    fn get_or_make(&mut self, name: &str, make: impl FnOnce() -> Arc<OutputBudget>) -> Arc<OutputBudget> {
        if let Some(budget) = self.live.get(name).and_then(Weak::upgrade) {
            return budget;
        }
        let budget = make();
        self.live.insert(name.to_owned(), Arc::downgrade(&budget));
        if self.live.len() > 2 * self.pruned_at.max(32) {
            self.live.retain(|_, budget| budget.strong_count() > 0);
            self.pruned_at = self.live.len();
        }
        budget
    }
}

/// Every sandbox's and tenant's output budget.
pub(crate) struct OutputBudgets {
    per_sandbox: u64,
    tenants: Mutex<Budgets>,
    sandboxes: Mutex<Budgets>,
}

impl OutputBudgets {
    /// Budgets of `per_sandbox` bytes per sandbox (each tenant's from its quota).
    pub(crate) fn new(per_sandbox: u64) -> OutputBudgets {
        OutputBudgets { per_sandbox, tenants: Mutex::default(), sandboxes: Mutex::default() }
    }

    /// The most the server carries of one stream of one command (it can never hold more for the sandbox), so also
    /// what the agent reads of a stream at most, whoever consumes it.
    pub(crate) fn stream_cap(&self, output_limit: u64) -> u64 {
        output_limit.min(self.per_sandbox)
    }

    /// The budget of sandbox `id` of `tenant` (made when nothing holds output under it).
    pub(crate) fn sandbox(&self, tenant: &Tenant, id: &str) -> Arc<OutputBudget> {
        let limit = tenant.quota.max_output_bytes;
        let make_tenant = || OutputBudget::new(limit, None);
        let Ok(mut tenants) = self.tenants.lock() else { return OutputBudget::new(0, None) };
        let parent = tenants.get_or_make(&tenant.name, make_tenant);
        drop(tenants);
        let Ok(mut sandboxes) = self.sandboxes.lock() else { return OutputBudget::new(0, None) };
        sandboxes.get_or_make(id, || OutputBudget::new(self.per_sandbox, Some(parent)))
    }

    /// A holder for one answer's output in sandbox `id`.
    pub(crate) fn hold(&self, tenant: &Tenant, id: &str) -> Held {
        Held::new(self.sandbox(tenant, id))
    }

    /// What a background command of sandbox `id` may retain: `per_stream` bytes of each stream, charged to the
    /// sandbox's budget.
    pub(crate) fn retention(&self, tenant: &Tenant, id: &str, per_stream: u64) -> OutputRetention {
        OutputRetention { per_stream, budget: self.sandbox(tenant, id) }
    }

    /// What a pool member's zygote may retain before any tenant owns the member: a budget of its own, of the
    /// per-sandbox size (a zygote's output is the runs' it forks, which their answers are charged for again).
    pub(crate) fn retention_unowned(&self, per_stream: u64) -> OutputRetention {
        OutputRetention { per_stream, budget: OutputBudget::new(self.per_sandbox, None) }
    }

    /// Entries (live or not yet pruned) in the registry: (tenants, sandboxes).
    #[cfg(test)]
    fn entries(&self) -> (usize, usize) {
        let count = |budgets: &Mutex<Budgets>| budgets.lock().map(|b| b.live.len()).unwrap_or_default();
        (count(&self.tenants), count(&self.sandboxes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Quota;

    fn tenant(name: &str, max_output_bytes: u64) -> Tenant {
        let quota =
            Quota { max_sandboxes: 10, max_memory_bytes: 1, max_pids: 1, max_output_bytes, max_snapshot_bytes: 1 };
        Tenant { name: Arc::from(name), quota, admin: false, scan: Arc::default(), trust: Default::default() }
    }

    #[test]
    fn a_sandbox_budget_sits_inside_its_tenants_and_lives_while_output_is_held() {
        let budgets = OutputBudgets::new(100);
        let acme = tenant("acme", 150);
        let mut first = budgets.hold(&acme, "sb-1");
        let mut second = budgets.hold(&acme, "sb-2");
        assert_eq!(first.take(120), 100, "the sandbox's budget");
        assert_eq!(second.take(120), 50, "the tenant's budget");
        let mut again = budgets.hold(&acme, "sb-1");
        assert_eq!(again.take(10), 0, "one budget per sandbox, shared by its holders");
        drop((first, second, again));
        assert_eq!(budgets.hold(&acme, "sb-1").take(120), 100, "credited back");
    }

    #[test]
    fn budgets_nothing_holds_are_pruned() {
        let budgets = OutputBudgets::new(100);
        let acme = tenant("acme", 1000);
        for n in 0..1000 {
            drop(budgets.hold(&acme, &format!("sb-{n}")));
        }
        let (tenants, sandboxes) = budgets.entries();
        assert!(tenants <= 1 && sandboxes <= 64, "{tenants} tenant and {sandboxes} sandbox entries kept");
    }
}
