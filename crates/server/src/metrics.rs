//! Prometheus metrics of one server: a private recorder (not the process-global one, so that several routers in one
//! test process do not mix their numbers), rendered at `GET /metrics`.
//!
//! - `sandkasten_sandboxes_active` (gauge): running sandboxes, refreshed from the store at each scrape
//! - `sandkasten_sandbox_creates_total` (counter): sandboxes created
//! - `sandkasten_sandbox_create_seconds` (histogram): wall time of the runtime's create (`POST /v1/sandboxes`, `/v1/run`)
//! - `sandkasten_sandbox_exits_total{reason}` (counter): sandboxes that ended: `deleted`, `expired`, `lost`, `run_finished`
//! - `sandkasten_exec_duration_seconds` (histogram): wall time of commands (`/exec` and `/v1/run`)
//! - `sandkasten_exec_phase_seconds{phase}` (histogram): `/exec` only: `first_output` = time to the first output chunk
//!   (commands without output add nothing), `total` = the whole command
//! - `sandkasten_run_phase_seconds{phase}` (histogram): `POST /v1/run`, cumulative from the request: `allocate` (sandbox created or
//!   claimed from a pool), `files_ready`, `first_output` (runs with output only), `total` (the command's end)
//! - `sandkasten_limit_kills_total{kind}` (counter): executions stopped by a limit; `time` = an exec, a background command or a
//!   code cell stopped at its timeout (output truncation is not a kill and is not counted)
//! - `sandkasten_commands_running` (gauge): background commands running now
//! - `sandkasten_errors_total{code}` (counter): error responses by API error code
//! - `sandkasten_pool_hits_total` / `sandkasten_pool_misses_total` (counters): creates served by a warm pool / creates whose spec a pool
//!   serves but that found it empty (specs no pool serves count as neither)
//! - `sandkasten_pool_size{class}` (gauge): ready members of each pool
//! - `sandkasten_pool_target{class}` (gauge): ready members each pool refills to now (`min`, raised by recent misses up to `max`)
//! - `sandkasten_pool_refill_seconds` (histogram): wall time of creating one pool member (and starting its zygote)
//! - `sandkasten_zygote_runs_total` (counter): `POST /v1/run` executions handed to a pool member's zygote (forked from it)
//!
//! - `sandkasten_egress_requests_total{decision}` (counter): connection attempts through the egress proxy, `allowed`,
//!   `refused` (policy or address check) or `failed` (allowed, but the name did not resolve or the host did not answer)
//! - `sandkasten_egress_bytes_total{direction}` (counter): bytes through the proxy, `up` (sandbox → host) or `down`
//! - `sandkasten_egress_audit_dropped_total` (counter): audit events dropped because the audit writer fell behind
//!
//! On a pool hit `sandkasten_sandbox_create_seconds` records the claim (taking a ready member), not the member's creation.

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};
use sandkasten_types::LimitKind;

const SANDBOXES_ACTIVE: &str = "sandkasten_sandboxes_active";
const SANDBOX_CREATES: &str = "sandkasten_sandbox_creates_total";
const EXEC_DURATION: &str = "sandkasten_exec_duration_seconds";
const ERRORS: &str = "sandkasten_errors_total";
const COMMANDS_RUNNING: &str = "sandkasten_commands_running";
const SANDBOX_CREATE_SECONDS: &str = "sandkasten_sandbox_create_seconds";
const SANDBOX_EXITS: &str = "sandkasten_sandbox_exits_total";
const EXEC_PHASE: &str = "sandkasten_exec_phase_seconds";
const LIMIT_KILLS: &str = "sandkasten_limit_kills_total";
const POOL_HITS: &str = "sandkasten_pool_hits_total";
const POOL_MISSES: &str = "sandkasten_pool_misses_total";
const POOL_SIZE: &str = "sandkasten_pool_size";
const POOL_TARGET: &str = "sandkasten_pool_target";
const POOL_REFILL_SECONDS: &str = "sandkasten_pool_refill_seconds";
const ZYGOTE_RUNS: &str = "sandkasten_zygote_runs_total";
const RUN_PHASE: &str = "sandkasten_run_phase_seconds";
const EGRESS_REQUESTS: &str = "sandkasten_egress_requests_total";
const EGRESS_BYTES: &str = "sandkasten_egress_bytes_total";
const EGRESS_AUDIT_DROPPED: &str = "sandkasten_egress_audit_dropped_total";

/// Histogram buckets of `sandkasten_exec_duration_seconds` and `sandkasten_exec_phase_seconds`.
const EXEC_BUCKETS: [f64; 12] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0];

/// Histogram buckets of `sandkasten_run_phase_seconds` (a pool hit's allocate is well under a millisecond).
const RUN_BUCKETS: [f64; 14] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

/// Histogram buckets of `sandkasten_sandbox_create_seconds`.
const CREATE_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// A phase of an `/exec` command (`sandkasten_exec_phase_seconds{phase}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecPhase {
    /// From the start to the first output chunk.
    FirstOutput,
    /// From the start to the end.
    Total,
}

impl ExecPhase {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecPhase::FirstOutput => "first_output",
            ExecPhase::Total => "total",
        }
    }
}

/// Why a sandbox ended (`sandkasten_sandbox_exits_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    /// `DELETE /v1/sandboxes/{id}`.
    Deleted,
    /// Its timeout passed.
    Expired,
    /// Its processes died outside the server's control (found at startup or by a request).
    Lost,
    /// A `/v1/run` finished with it.
    RunFinished,
}

impl ExitReason {
    /// Every reason (each is listed at zero from the start).
    pub const ALL: [ExitReason; 4] =
        [ExitReason::Deleted, ExitReason::Expired, ExitReason::Lost, ExitReason::RunFinished];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ExitReason::Deleted => "deleted",
            ExitReason::Expired => "expired",
            ExitReason::Lost => "lost",
            ExitReason::RunFinished => "run_finished",
        }
    }
}

/// The metrics of one server.
pub struct Metrics {
    recorder: PrometheusRecorder,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// A recorder with every metric described and the counters at zero, so a scrape lists them from the start.
    pub fn new() -> Metrics {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(EXEC_DURATION.into()), &EXEC_BUCKETS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(EXEC_PHASE.into()), &EXEC_BUCKETS))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(RUN_PHASE.into()), &RUN_BUCKETS))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(SANDBOX_CREATE_SECONDS.into()), &CREATE_BUCKETS))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(POOL_REFILL_SECONDS.into()), &CREATE_BUCKETS));
        // Setting buckets only fails for an empty list; fall back to the exporter's summaries if it ever does.
        let recorder = builder.unwrap_or_else(|_| PrometheusBuilder::new()).build_recorder();
        metrics::with_local_recorder(&recorder, || {
            describe_gauge!(SANDBOXES_ACTIVE, "Sandboxes currently running");
            describe_counter!(SANDBOX_CREATES, "Sandboxes created");
            describe_histogram!(EXEC_DURATION, Unit::Seconds, "Wall time of commands run through the exec API");
            describe_counter!(ERRORS, "Error responses, by API error code");
            describe_gauge!(COMMANDS_RUNNING, "Background commands running now");
            describe_histogram!(SANDBOX_CREATE_SECONDS, Unit::Seconds, "Wall time of the runtime creating a sandbox");
            describe_counter!(SANDBOX_EXITS, "Sandboxes that ended, by reason (deleted, expired, lost, run_finished)");
            describe_histogram!(
                EXEC_PHASE,
                Unit::Seconds,
                "Phases of commands run through /exec: first_output (time to the first output chunk) and total"
            );
            describe_histogram!(
                RUN_PHASE,
                Unit::Seconds,
                "Phases of POST /v1/run from its request: allocate, filesystem_ready, runtime_ready, first_command, total"
            );
            describe_counter!(LIMIT_KILLS, "Executions stopped by a limit, by kind (time: killed at their timeout)");
            counter!(LIMIT_KILLS, "kind" => LimitKind::Time.as_str()).absolute(0);
            for reason in ExitReason::ALL {
                counter!(SANDBOX_EXITS, "reason" => reason.as_str()).absolute(0);
            }
            describe_counter!(POOL_HITS, "Creates served by a warm pool");
            describe_counter!(POOL_MISSES, "Creates a warm pool serves that found it empty");
            describe_counter!(ZYGOTE_RUNS, "One-shot runs forked from a pool member's zygote");
            describe_gauge!(POOL_SIZE, "Ready sandboxes of each warm pool");
            describe_gauge!(
                POOL_TARGET,
                "Ready sandboxes each warm pool refills to now (min, raised by recent misses)"
            );
            describe_histogram!(POOL_REFILL_SECONDS, Unit::Seconds, "Wall time of creating one warm pool sandbox");
            describe_counter!(EGRESS_REQUESTS, "Connection attempts through the egress proxy, by decision");
            describe_counter!(EGRESS_BYTES, "Bytes through the egress proxy, by direction (up: sandbox to host)");
            describe_counter!(EGRESS_AUDIT_DROPPED, "Egress audit events dropped because the writer fell behind");
            for decision in ["allowed", "refused", "failed"] {
                counter!(EGRESS_REQUESTS, "decision" => decision).absolute(0);
            }
            counter!(EGRESS_AUDIT_DROPPED).absolute(0);
            counter!(POOL_HITS).absolute(0);
            counter!(POOL_MISSES).absolute(0);
            gauge!(COMMANDS_RUNNING).set(0.0);
            gauge!(SANDBOXES_ACTIVE).set(0.0);
            counter!(SANDBOX_CREATES).absolute(0);
        });
        Metrics { recorder }
    }

    /// Counts a created sandbox.
    pub fn sandbox_created(&self) {
        metrics::with_local_recorder(&self.recorder, || counter!(SANDBOX_CREATES).increment(1));
    }

    /// Records how long the runtime took to create a sandbox.
    pub fn sandbox_create_finished(&self, seconds: f64) {
        metrics::with_local_recorder(&self.recorder, || histogram!(SANDBOX_CREATE_SECONDS).record(seconds));
    }

    /// Counts a sandbox that ended.
    pub fn sandbox_exited(&self, reason: ExitReason) {
        metrics::with_local_recorder(&self.recorder, || {
            counter!(SANDBOX_EXITS, "reason" => reason.as_str()).increment(1);
        });
    }

    /// Records one phase of an `/exec` command.
    pub fn exec_phase(&self, phase: ExecPhase, seconds: f64) {
        metrics::with_local_recorder(&self.recorder, || {
            histogram!(EXEC_PHASE, "phase" => phase.as_str()).record(seconds);
        });
    }

    /// Counts an execution stopped by a limit.
    pub fn limit_kill(&self, kind: LimitKind) {
        metrics::with_local_recorder(&self.recorder, || counter!(LIMIT_KILLS, "kind" => kind.as_str()).increment(1));
    }

    /// Records a command's wall time.
    pub fn exec_finished(&self, seconds: f64) {
        metrics::with_local_recorder(&self.recorder, || histogram!(EXEC_DURATION).record(seconds));
    }

    /// Counts a background command that started.
    pub fn command_started(&self) {
        metrics::with_local_recorder(&self.recorder, || gauge!(COMMANDS_RUNNING).increment(1.0));
    }

    /// Counts a background command that ended.
    pub fn command_ended(&self) {
        metrics::with_local_recorder(&self.recorder, || gauge!(COMMANDS_RUNNING).decrement(1.0));
    }

    /// Counts a create served by a pool.
    pub fn pool_hit(&self) {
        metrics::with_local_recorder(&self.recorder, || counter!(POOL_HITS).increment(1));
    }

    /// Counts a create that found its pool empty.
    pub fn pool_miss(&self) {
        metrics::with_local_recorder(&self.recorder, || counter!(POOL_MISSES).increment(1));
    }

    /// Sets the number of ready members of pool `class`.
    pub fn pool_size(&self, class: &str, ready: usize) {
        let class = class.to_owned();
        metrics::with_local_recorder(&self.recorder, || gauge!(POOL_SIZE, "class" => class).set(ready as f64));
    }

    /// Sets the number of ready members pool `class` refills to now.
    pub fn pool_target(&self, class: &str, target: usize) {
        let class = class.to_owned();
        metrics::with_local_recorder(&self.recorder, || gauge!(POOL_TARGET, "class" => class).set(target as f64));
    }

    /// Records how long creating one pool member took.
    pub fn pool_refilled(&self, seconds: f64) {
        metrics::with_local_recorder(&self.recorder, || histogram!(POOL_REFILL_SECONDS).record(seconds));
    }

    /// Counts a run handed to a zygote.
    pub fn zygote_run(&self) {
        metrics::with_local_recorder(&self.recorder, || counter!(ZYGOTE_RUNS).increment(1));
    }

    /// Records a phase of a `POST /v1/run` (seconds since its request).
    pub fn run_phase(&self, phase: &'static str, seconds: f64) {
        metrics::with_local_recorder(&self.recorder, || histogram!(RUN_PHASE, "phase" => phase).record(seconds));
    }

    /// Counts one connection attempt through the egress proxy and the bytes it moved.
    pub fn egress_attempt(&self, decision: &str, bytes_up: u64, bytes_down: u64) {
        let decision = decision.to_owned();
        metrics::with_local_recorder(&self.recorder, || {
            counter!(EGRESS_REQUESTS, "decision" => decision).increment(1);
            counter!(EGRESS_BYTES, "direction" => "up").increment(bytes_up);
            counter!(EGRESS_BYTES, "direction" => "down").increment(bytes_down);
        });
    }

    /// Counts audit events lost because the writer fell behind.
    pub fn egress_audit_dropped(&self, events: u64) {
        metrics::with_local_recorder(&self.recorder, || counter!(EGRESS_AUDIT_DROPPED).increment(events));
    }

    /// Counts an error response.
    pub fn error(&self, code: &'static str) {
        metrics::with_local_recorder(&self.recorder, || counter!(ERRORS, "code" => code).increment(1));
    }

    /// Renders the Prometheus text exposition, with `active` running sandboxes.
    pub fn render(&self, active: u64) -> String {
        metrics::with_local_recorder(&self.recorder, || gauge!(SANDBOXES_ACTIVE).set(active as f64));
        let handle = self.recorder.handle();
        handle.run_upkeep();
        handle.render()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_rendered() {
        let metrics = Metrics::new();
        metrics.sandbox_created();
        metrics.exec_finished(0.02);
        metrics.error("not_found");
        metrics.command_started();
        metrics.command_started();
        metrics.command_ended();
        metrics.sandbox_create_finished(0.03);
        metrics.exec_phase(ExecPhase::FirstOutput, 0.004);
        metrics.exec_phase(ExecPhase::Total, 0.02);
        metrics.limit_kill(LimitKind::Time);
        metrics.sandbox_exited(ExitReason::Expired);
        metrics.sandbox_exited(ExitReason::Expired);
        metrics.pool_hit();
        metrics.pool_miss();
        metrics.pool_miss();
        metrics.pool_size("small", 2);
        metrics.pool_target("small", 3);
        metrics.pool_refilled(0.02);
        metrics.run_phase("allocate", 0.0004);
        metrics.egress_attempt("refused", 0, 0);
        metrics.egress_attempt("allowed", 10, 200);
        let text = metrics.render(3);
        for needle in [
            "sandkasten_sandboxes_active 3",
            "sandkasten_sandbox_creates_total 1",
            "sandkasten_exec_duration_seconds_bucket{le=\"0.025\"} 1",
            "sandkasten_errors_total{code=\"not_found\"} 1",
            "sandkasten_commands_running 1",
            "sandkasten_sandbox_create_seconds_bucket{le=\"0.05\"} 1",
            "sandkasten_exec_phase_seconds_bucket{phase=\"first_output\",le=\"0.005\"} 1",
            "sandkasten_exec_phase_seconds_count{phase=\"total\"} 1",
            "sandkasten_limit_kills_total{kind=\"time\"} 1",
            "sandkasten_sandbox_exits_total{reason=\"expired\"} 2",
            "sandkasten_sandbox_exits_total{reason=\"deleted\"} 0",
            "sandkasten_sandbox_exits_total{reason=\"run_finished\"} 0",
            "sandkasten_pool_hits_total 1",
            "sandkasten_pool_misses_total 2",
            "sandkasten_pool_size{class=\"small\"} 2",
            "sandkasten_pool_target{class=\"small\"} 3",
            "sandkasten_pool_refill_seconds_bucket{le=\"0.025\"} 1",
            "sandkasten_egress_requests_total{decision=\"refused\"} 1",
            "sandkasten_egress_bytes_total{direction=\"down\"} 200",
            "sandkasten_egress_audit_dropped_total 0",
            "sandkasten_run_phase_seconds_bucket{phase=\"allocate\",le=\"0.0005\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }
}
