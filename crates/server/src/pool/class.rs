//! The bookkeeping of one warm pool, without any I/O: which sandboxes are ready, how many are being created, and how
//! many more to create. The refill task and the claim path drive it under one lock.

use std::collections::VecDeque;

use sandkasten_types::SandboxSpec;

/// A ready member: its sandbox id and, when the pool has a zygote, the zygote's background command id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// The sandbox id.
    pub(crate) id: String,
    /// The zygote's command id (running when the member became ready).
    pub(crate) zygote: Option<String>,
}

impl Member {
    /// A member without a zygote.
    #[cfg(test)]
    pub(crate) fn plain(id: &str) -> Member {
        Member { id: id.to_owned(), zygote: None }
    }
}

/// One pool: ready sandboxes of one spec.
#[derive(Debug)]
pub(crate) struct PoolClass {
    /// Name (the `class` label of `pool_size`).
    pub(crate) name: String,
    /// What every sandbox of the pool is created with (its `env` is empty).
    pub(crate) spec: SandboxSpec,
    /// The zygote started in each member once it exists (its argv), if the pool has one.
    pub(crate) zygote: Option<Vec<String>>,
    min: usize,
    max: usize,
    ready: VecDeque<Member>,
    filling: usize,
}

impl PoolClass {
    /// An empty pool keeping `min` ready sandboxes, never holding more than `max` (ready or being created).
    pub(crate) fn new(name: String, spec: SandboxSpec, min: usize, max: usize) -> PoolClass {
        PoolClass { name, spec, zygote: None, min, max: max.max(min), ready: VecDeque::new(), filling: 0 }
    }

    /// Whether a request for `spec` may take a sandbox of this pool: same template and limits, and no `env` or
    /// secrets (the agent bakes the environment in at creation). The network policy does not matter: it is applied
    /// by the egress proxy after the claim.
    pub(crate) fn serves(&self, spec: &SandboxSpec) -> bool {
        spec.env.is_empty()
            && spec.secrets.is_empty()
            && spec.template == self.spec.template
            && spec.limits == self.spec.limits
    }

    /// Ready sandboxes.
    pub(crate) fn ready(&self) -> usize {
        self.ready.len()
    }

    /// Takes the oldest ready sandbox; it leaves the pool for good.
    pub(crate) fn take(&mut self) -> Option<Member> {
        self.ready.pop_front()
    }

    /// Puts back a sandbox taken by `take` that nobody used (its caller was refused before touching it).
    pub(crate) fn give_back(&mut self, member: Member) {
        self.ready.push_front(member);
    }

    /// Whether another sandbox should be created now.
    pub(crate) fn wants_more(&self) -> bool {
        let held = self.ready.len() + self.filling;
        held < self.min && held < self.max
    }

    /// Counts a creation that has started.
    pub(crate) fn fill_started(&mut self) {
        self.filling += 1;
    }

    /// Counts a creation that ended: `Some(member)` when the sandbox is ready. Returns its id back when the pool is
    /// full already (the caller destroys it).
    pub(crate) fn fill_finished(&mut self, member: Option<Member>) -> Option<String> {
        self.filling = self.filling.saturating_sub(1);
        let member = member?;
        if self.ready.len() >= self.max {
            return Some(member.id);
        }
        self.ready.push_back(member);
        None
    }

    /// Drops the ready sandboxes that `alive` says are dead; returns them.
    pub(crate) fn prune(&mut self, alive: impl Fn(&str) -> bool) -> Vec<String> {
        let (keep, dead): (VecDeque<Member>, VecDeque<Member>) = self.ready.drain(..).partition(|m| alive(&m.id));
        self.ready = keep;
        dead.into_iter().map(|m| m.id).collect()
    }

    /// Every ready sandbox, removed from the pool (shutdown).
    pub(crate) fn drain(&mut self) -> Vec<String> {
        self.ready.drain(..).map(|m| m.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn pool(min: usize, max: usize) -> PoolClass {
        PoolClass::new("p".into(), SandboxSpec::default(), min, max)
    }

    #[test]
    fn fills_to_min_counting_creations_in_flight() {
        let mut p = pool(2, 4);
        assert!(p.wants_more());
        p.fill_started();
        assert!(p.wants_more());
        p.fill_started();
        assert!(!p.wants_more(), "two in flight reach min");
        assert_eq!(p.fill_finished(Some(Member::plain("a"))), None);
        assert_eq!(p.fill_finished(None), None);
        assert_eq!(p.ready(), 1);
        assert!(p.wants_more(), "a failed creation is retried");
    }

    #[test]
    fn a_taken_sandbox_is_gone_and_each_id_is_handed_out_once() {
        let mut p = pool(2, 2);
        for id in ["a", "b"] {
            p.fill_started();
            p.fill_finished(Some(Member::plain(id)));
        }
        assert_eq!(p.take(), Some(Member::plain("a")));
        assert_eq!(p.take(), Some(Member::plain("b")));
        assert_eq!(p.take(), None);
        assert!(p.wants_more());
    }

    #[test]
    fn never_holds_more_than_max() {
        let mut p = pool(1, 1);
        p.fill_started();
        p.fill_finished(Some(Member::plain("a")));
        p.fill_started();
        assert_eq!(p.fill_finished(Some(Member::plain("b"))).as_deref(), Some("b"));
        assert_eq!(p.ready(), 1);
    }

    #[test]
    fn only_the_same_spec_without_env_is_served() {
        let p = pool(1, 1);
        assert!(p.serves(&SandboxSpec::default()));
        let mut other = SandboxSpec::default();
        other.limits.pids = 7;
        assert!(!p.serves(&other));
        let with_env = SandboxSpec { env: BTreeMap::from([("A".into(), "b".into())]), ..SandboxSpec::default() };
        assert!(!p.serves(&with_env));
    }

    #[test]
    fn dead_members_are_pruned_and_unused_ones_given_back_first() {
        let mut p = pool(3, 3);
        for id in ["a", "b", "c"] {
            p.fill_started();
            p.fill_finished(Some(Member::plain(id)));
        }
        assert_eq!(p.prune(|id| id != "b"), vec!["b".to_owned()]);
        assert_eq!(p.ready(), 2);
        let a = p.take().unwrap_or_else(|| Member::plain("none"));
        p.give_back(a);
        assert_eq!(p.take(), Some(Member::plain("a")));
        assert_eq!(p.drain(), vec!["c".to_owned()]);
    }
}
