//! Prometheus metrics of one server: a private recorder (not the process-global one, so that several routers in one
//! test process do not mix their numbers), rendered at `GET /metrics`.
//!
//! - `sandboxes_active` (gauge): running sandboxes, refreshed from the store at each scrape
//! - `sandbox_creates_total` (counter): sandboxes created
//! - `exec_duration_seconds` (histogram): wall time of commands
//! - `commands_running` (gauge): background commands running now
//! - `errors_total{code}` (counter): error responses by API error code

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};

const SANDBOXES_ACTIVE: &str = "sandboxes_active";
const SANDBOX_CREATES: &str = "sandbox_creates_total";
const EXEC_DURATION: &str = "exec_duration_seconds";
const ERRORS: &str = "errors_total";
const COMMANDS_RUNNING: &str = "commands_running";

/// Histogram buckets of `exec_duration_seconds`.
const EXEC_BUCKETS: [f64; 12] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0];

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
        let builder =
            PrometheusBuilder::new().set_buckets_for_metric(Matcher::Full(EXEC_DURATION.into()), &EXEC_BUCKETS);
        // Setting buckets only fails for an empty list; fall back to the exporter's summaries if it ever does.
        let recorder = builder.unwrap_or_else(|_| PrometheusBuilder::new()).build_recorder();
        metrics::with_local_recorder(&recorder, || {
            describe_gauge!(SANDBOXES_ACTIVE, "Sandboxes currently running");
            describe_counter!(SANDBOX_CREATES, "Sandboxes created");
            describe_histogram!(EXEC_DURATION, Unit::Seconds, "Wall time of commands run through the exec API");
            describe_counter!(ERRORS, "Error responses, by API error code");
            describe_gauge!(COMMANDS_RUNNING, "Background commands running now");
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
        let text = metrics.render(3);
        for needle in [
            "sandboxes_active 3",
            "sandbox_creates_total 1",
            "exec_duration_seconds_bucket{le=\"0.025\"} 1",
            "errors_total{code=\"not_found\"} 1",
            "commands_running 1",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }
}
