//! The bookkeeping of one warm pool, without any I/O: which sandboxes are ready, how many are being created, how
//! many more to create, and how the target grows on misses. The refill task, the claim path and the sizing API drive
//! it under one lock.
//!
//! Growth on misses: the pool refills to its *target*, `min + boost` (never more than `max`). Each miss (a claim that
//! found the pool empty) raises `boost` by one; every [`GROW_DECAY`] without a miss lowers it by one, back to `min`.
//! A lower target only stops refilling: ready members stay until claimed (only a lower `max` destroys any).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use sandkasten_types::SandboxSpec;

use crate::config::ZygoteKind;

/// One pool as `GET /v1/pools` shows it.
#[derive(Debug, Clone)]
pub(crate) struct PoolStatus {
    /// The pool's name.
    pub(crate) name: String,
    /// The spec its sandboxes are created with (isolation tier, template and limits).
    pub(crate) spec: SandboxSpec,
    /// Its zygote, if any.
    pub(crate) zygote: Option<ZygoteKind>,
    /// Its numbers.
    pub(crate) numbers: Snapshot,
}

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

/// How long a pool's target stays raised by a miss: each period without a miss lowers it by one.
pub(crate) const GROW_DECAY: Duration = Duration::from_secs(10);

/// A pool's numbers at one moment (`GET /v1/pools`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// Ready sandboxes kept at least.
    pub(crate) min: usize,
    /// Most sandboxes held, ready or being created.
    pub(crate) max: usize,
    /// Ready sandboxes the refill task aims for now (`min` plus the growth on recent misses, at most `max`).
    pub(crate) target: usize,
    /// Ready sandboxes.
    pub(crate) ready: usize,
    /// Sandboxes being created.
    pub(crate) creating: usize,
    /// Claims served since the server started.
    pub(crate) hits: u64,
    /// Claims that found the pool empty since the server started.
    pub(crate) misses: u64,
}

/// One pool: ready sandboxes of one spec.
#[derive(Debug)]
pub(crate) struct PoolClass {
    /// Name (the `class` label of `sandkasten_pool_size`).
    pub(crate) name: String,
    /// What every sandbox of the pool is created with (its `env` is empty).
    pub(crate) spec: SandboxSpec,
    /// The zygote started in each member once it exists (its argv), if the pool has one.
    pub(crate) zygote: Option<Vec<String>>,
    /// Which interpreter that zygote is.
    pub(crate) zygote_kind: Option<ZygoteKind>,
    /// The modules the zygote and the spare kernel preload.
    pub(crate) preload: Vec<String>,
    /// Counts the spec's replacements (a rebuilt template): a creation started under an older one is not kept.
    pub(crate) generation: u64,
    min: usize,
    max: usize,
    ready: VecDeque<Member>,
    filling: usize,
    hits: u64,
    misses: u64,
    /// Growth of the target over `min` from recent misses.
    boost: usize,
    /// When `boost` last changed (a miss, or one step of decay).
    boost_since: Option<Instant>,
}

impl PoolClass {
    /// An empty pool keeping `min` ready sandboxes, never holding more than `max` (ready or being created).
    pub(crate) fn new(name: String, spec: SandboxSpec, min: usize, max: usize) -> PoolClass {
        PoolClass {
            name,
            spec,
            zygote: None,
            zygote_kind: None,
            preload: Vec::new(),
            generation: 0,
            min,
            max: max.max(min),
            ready: VecDeque::new(),
            filling: 0,
            hits: 0,
            misses: 0,
            boost: 0,
            boost_since: None,
        }
    }

    /// The pool's numbers now.
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            min: self.min,
            max: self.max,
            target: self.target(),
            ready: self.ready.len(),
            creating: self.filling,
            hits: self.hits,
            misses: self.misses,
        }
    }

    /// Name, spec, zygote and numbers.
    pub(crate) fn status(&self) -> PoolStatus {
        PoolStatus {
            name: self.name.clone(),
            spec: self.spec.clone(),
            zygote: self.zygote_kind,
            numbers: self.snapshot(),
        }
    }

    /// Ready sandboxes the refill task aims for: `min` plus the growth on recent misses, at most `max`.
    pub(crate) fn target(&self) -> usize {
        self.min.saturating_add(self.boost).min(self.max)
    }

    /// Counts a claim: a hit when it found a member, else a miss (which raises the target by one, up to `max`).
    pub(crate) fn count_claim(&mut self, hit: bool, now: Instant) {
        if hit {
            self.hits += 1;
            return;
        }
        self.misses += 1;
        if self.target() < self.max {
            self.boost += 1;
        }
        self.boost_since = Some(now);
    }

    /// Lowers the growth by one for every [`GROW_DECAY`] since it last changed.
    pub(crate) fn decay(&mut self, now: Instant) {
        while self.boost > 0
            && let Some(since) = self.boost_since
            && now.saturating_duration_since(since) >= GROW_DECAY
        {
            self.boost -= 1;
            self.boost_since = Some(since + GROW_DECAY);
        }
    }

    /// New sizes (already validated: `min <= max`). Returns the ready members beyond the new `max`, newest first,
    /// removed from the pool (the caller destroys them); creations in flight past it are destroyed when they end.
    pub(crate) fn resize(&mut self, min: usize, max: usize) -> Vec<String> {
        self.min = min;
        self.max = max.max(min);
        self.boost = self.boost.min(self.max - self.min);
        let mut surplus = Vec::new();
        while self.ready.len() > self.max {
            if let Some(member) = self.ready.pop_back() {
                surplus.push(member.id);
            }
        }
        surplus
    }

    /// Whether a request for `spec` may take a sandbox of this pool: same isolation tier (both resolved: the server
    /// sets the request's before it claims), template (layout and layers) and limits, no `env` but the template's own
    /// and no secrets (the agent bakes the environment in at creation). The network policy does not matter: it is
    /// applied by the egress proxy after the claim.
    pub(crate) fn serves(&self, spec: &SandboxSpec) -> bool {
        spec.env == self.spec.env
            && spec.secrets.is_empty()
            && spec.tier() == self.spec.tier()
            && spec.template == self.spec.template
            && spec.layers == self.spec.layers
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
        held < self.target() && held < self.max
    }

    /// Counts a creation that has started.
    pub(crate) fn fill_started(&mut self) {
        self.filling += 1;
    }

    /// Counts a creation that ended (started under spec `generation`): `Some(member)` when the sandbox is ready.
    /// Returns its id back when the pool holds its target already (a claimed member given back meanwhile, a target
    /// that went down) or the spec was replaced since the creation started: the caller destroys it.
    pub(crate) fn fill_finished(&mut self, member: Option<Member>, generation: u64) -> Option<String> {
        self.filling = self.filling.saturating_sub(1);
        let member = member?;
        if generation != self.generation || self.ready.len() >= self.target() {
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

    /// Makes the pool's sandboxes of `spec` (its template was rebuilt) with `zygote` and `preload`: the ready ones
    /// of the old spec are removed and returned (the caller destroys them), creations in flight are not kept.
    pub(crate) fn replace_spec(
        &mut self,
        spec: SandboxSpec,
        zygote: Option<Vec<String>>,
        preload: Vec<String>,
    ) -> Vec<String> {
        self.spec = spec;
        self.zygote = zygote;
        self.preload = preload;
        self.generation += 1;
        self.drain()
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
        assert_eq!(p.fill_finished(Some(Member::plain("a")), 0), None);
        assert_eq!(p.fill_finished(None, 0), None);
        assert_eq!(p.ready(), 1);
        assert!(p.wants_more(), "a failed creation is retried");
    }

    #[test]
    fn a_taken_sandbox_is_gone_and_each_id_is_handed_out_once() {
        let mut p = pool(2, 2);
        for id in ["a", "b"] {
            p.fill_started();
            p.fill_finished(Some(Member::plain(id)), 0);
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
        p.fill_finished(Some(Member::plain("a")), 0);
        p.fill_started();
        assert_eq!(p.fill_finished(Some(Member::plain("b")), 0).as_deref(), Some("b"));
        assert_eq!(p.ready(), 1);
    }

    #[test]
    fn a_member_given_back_while_its_replacement_was_made_leaves_no_surplus() {
        let mut p = pool(1, 4);
        p.fill_started();
        p.fill_finished(Some(Member::plain("a")), 0);
        let claimed = p.take().unwrap_or_else(|| Member::plain("none"));
        p.fill_started(); // the refill replaces it...
        p.give_back(claimed); // ...while the caller is refused and gives it back
        assert_eq!(p.fill_finished(Some(Member::plain("b")), 0).as_deref(), Some("b"));
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
    fn a_member_serves_only_requests_of_its_own_tier() {
        use sandkasten_types::Tier;
        let spec = |tier| SandboxSpec { isolation: Some(tier), ..SandboxSpec::default() };
        let process = PoolClass::new("p".into(), spec(Tier::Process), 1, 1);
        let gvisor = PoolClass::new("g".into(), spec(Tier::Gvisor), 1, 1);
        assert!(process.serves(&spec(Tier::Process)) && !process.serves(&spec(Tier::Gvisor)));
        assert!(gvisor.serves(&spec(Tier::Gvisor)) && !gvisor.serves(&spec(Tier::Process)));
        assert!(!gvisor.serves(&SandboxSpec::default()), "an unset tier is process");
    }

    #[test]
    fn dead_members_are_pruned_and_unused_ones_given_back_first() {
        let mut p = pool(3, 3);
        for id in ["a", "b", "c"] {
            p.fill_started();
            p.fill_finished(Some(Member::plain(id)), 0);
        }
        assert_eq!(p.prune(|id| id != "b"), vec!["b".to_owned()]);
        assert_eq!(p.ready(), 2);
        let a = p.take().unwrap_or_else(|| Member::plain("none"));
        p.give_back(a);
        assert_eq!(p.take(), Some(Member::plain("a")));
        assert_eq!(p.drain(), vec!["c".to_owned()]);
    }

    fn filled(min: usize, max: usize, ids: &[&str]) -> PoolClass {
        let mut p = pool(min, max);
        for id in ids {
            p.fill_started();
            p.fill_finished(Some(Member::plain(id)), 0);
        }
        p
    }

    #[test]
    fn misses_raise_the_target_up_to_max_and_it_decays_back_to_min() {
        let mut p = pool(1, 3);
        let t0 = Instant::now();
        assert_eq!(p.target(), 1);
        p.count_claim(false, t0);
        p.count_claim(false, t0);
        p.count_claim(false, t0);
        assert_eq!(p.target(), 3, "capped at max");
        p.count_claim(true, t0);
        assert_eq!(p.snapshot(), Snapshot { min: 1, max: 3, target: 3, ready: 0, creating: 0, hits: 1, misses: 3 });
        p.decay(t0 + GROW_DECAY / 2);
        assert_eq!(p.target(), 3, "no decay before a full period");
        p.decay(t0 + GROW_DECAY);
        assert_eq!(p.target(), 2);
        p.count_claim(false, t0 + GROW_DECAY + GROW_DECAY / 2);
        assert_eq!(p.target(), 3, "a new miss raises it again and restarts the period");
        p.decay(t0 + GROW_DECAY * 2);
        assert_eq!(p.target(), 3);
        p.decay(t0 + GROW_DECAY * 10);
        assert_eq!(p.target(), 1, "back to min, never below");
    }

    #[test]
    fn a_raised_target_fills_past_min() {
        let mut p = filled(1, 4, &["a"]);
        assert!(!p.wants_more());
        p.count_claim(false, Instant::now());
        assert!(p.wants_more(), "one miss asks for one more");
        p.fill_started();
        assert!(!p.wants_more());
    }

    #[test]
    fn resizing_destroys_ready_members_past_the_new_max_and_caps_the_growth() {
        let mut p = filled(4, 5, &["a", "b", "c", "d"]);
        assert_eq!(p.resize(1, 2), vec!["d".to_owned(), "c".to_owned()], "newest first");
        assert_eq!(p.ready(), 2);
        assert!(!p.wants_more());
        assert_eq!(p.resize(4, 6), Vec::<String>::new());
        assert!(p.wants_more(), "a higher min refills");
        let t0 = Instant::now();
        for _ in 0..5 {
            p.count_claim(false, t0);
        }
        assert_eq!(p.target(), 6);
        p.resize(0, 2);
        assert_eq!(p.target(), 2, "the growth never exceeds the new max");
        p.resize(0, 0);
        assert_eq!((p.target(), p.ready()), (0, 0));
    }

    #[test]
    fn a_replaced_spec_drains_the_ready_members_and_keeps_no_creation_started_before() {
        let mut p = pool(2, 2);
        p.fill_started();
        p.fill_started();
        assert_eq!(p.fill_finished(Some(Member::plain("a")), 0), None);
        let spec = SandboxSpec { env: [("V".to_owned(), "2".to_owned())].into(), ..SandboxSpec::default() };
        assert_eq!(p.replace_spec(spec.clone(), None, Vec::new()), ["a"]);
        assert_eq!((p.ready(), p.spec.env.get("V").map(String::as_str)), (0, Some("2")));
        assert_eq!(p.fill_finished(Some(Member::plain("b")), 0).as_deref(), Some("b"), "made with the old spec");
        p.fill_started();
        assert_eq!(p.fill_finished(Some(Member::plain("c")), 1), None);
        assert_eq!(p.ready(), 1);
    }
}
