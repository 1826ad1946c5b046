//! The audit trail of egress: the proxy reports every attempt to [`AuditQueue`] (without blocking: a full queue
//! drops the event and counts it), and [`run`] writes them to the store in batches and counts them in the metrics.
//!
//! Refusals cost a sandbox nothing to make, so they may only fill part of the queue: a flood of refused attempts
//! (from one sandbox, to hide its own traffic or another tenant's) can never crowd out the events of connections
//! that were made — those record data that actually left.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sandkasten_egress::{AuditEvent, AuditSink, Decision};
use tokio::sync::mpsc;

use crate::egress::store::EgressEvent;
use crate::metrics::Metrics;
use crate::store::Store;

/// Events waiting for the writer; beyond this many, new ones are dropped (and counted).
const QUEUE: usize = 16_384;
/// Free places a refusal leaves in the queue: refusals are dropped (and counted) first, keeping this much room for
/// allowed and failed attempts.
const KEPT_FOR_CONNECTIONS: usize = QUEUE / 4;
/// Most events written in one transaction.
const BATCH: usize = 512;

/// The proxy's side of the audit queue.
#[derive(Debug)]
pub struct AuditQueue {
    sender: mpsc::Sender<AuditEvent>,
    dropped: AtomicU64,
}

impl AuditSink for AuditQueue {
    fn record(&self, event: AuditEvent) {
        // A refusal with a connection number ends a connection that was made (a blind tunnel refused at its opening):
        // it closes that connection's record, so it is kept like the connection's other records.
        if event.decision == Decision::Refused
            && event.connection.is_none()
            && self.sender.capacity() <= KEPT_FOR_CONNECTIONS
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.sender.try_send(event).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A queue and its receiving end (for [`run`]).
pub fn queue() -> (Arc<AuditQueue>, mpsc::Receiver<AuditEvent>) {
    let (sender, receiver) = mpsc::channel(QUEUE);
    (Arc::new(AuditQueue { sender, dropped: AtomicU64::new(0) }), receiver)
}

fn stored(event: AuditEvent) -> (String, String, EgressEvent) {
    let row = EgressEvent {
        time_ms: i64::try_from(event.time_ms).unwrap_or(i64::MAX),
        scheme: event.scheme.to_string(),
        host: event.host,
        port: event.port,
        resolved: event.resolved.map(|ip| ip.to_string()),
        decision: match event.decision {
            Decision::Allowed => "allowed",
            Decision::Refused => "refused",
            Decision::Failed => "failed",
        }
        .to_owned(),
        rule: event.rule,
        bytes_up: event.bytes_up,
        bytes_down: event.bytes_down,
        connection: event.connection,
        open: event.open,
    };
    (event.sandbox_id, event.tenant, row)
}

/// Writes queued events until the queue closes.
pub async fn run(store: &Store, metrics: &Metrics, queue: Arc<AuditQueue>, mut receiver: mpsc::Receiver<AuditEvent>) {
    let mut batch = Vec::with_capacity(BATCH);
    while receiver.recv_many(&mut batch, BATCH).await > 0 {
        let rows: Vec<_> = batch.drain(..).map(stored).collect();
        // An allowed connection counts once, when it ends (its opening record carries no bytes yet).
        for (_, _, row) in rows.iter().filter(|(_, _, row)| !row.open) {
            metrics.egress_attempt(&row.decision, row.bytes_up, row.bytes_down);
        }
        let dropped = queue.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            metrics.egress_audit_dropped(dropped);
            tracing::warn!(dropped, "egress audit events dropped: the writer fell behind");
        }
        if let Err(error) = store.append_egress_events(rows).await {
            tracing::error!(%error, "cannot write egress audit events");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn event(decision: Decision) -> AuditEvent {
        AuditEvent {
            time_ms: 1,
            sandbox_id: "sb-0000000000000001".into(),
            tenant: "t".into(),
            scheme: "connect".into(),
            host: "a.example".into(),
            port: 443,
            resolved: None,
            decision,
            rule: String::new(),
            bytes_up: 0,
            bytes_down: 0,
            connection: None,
            open: false,
        }
    }

    #[test]
    fn a_flood_of_refusals_cannot_crowd_out_connections_that_were_made() {
        let (queue, mut receiver) = queue();
        for _ in 0..QUEUE * 2 {
            queue.record(event(Decision::Refused));
        }
        assert!(queue.dropped.load(Ordering::Relaxed) > 0, "positive control: the flood overflowed");
        queue.record(event(Decision::Allowed));
        queue.record(event(Decision::Failed));
        // A tunnel refused at its opening ends a connection that was made: its record is kept too.
        queue.record(AuditEvent { connection: Some(7), ..event(Decision::Refused) });
        let mut seen = Vec::new();
        while let Ok(event) = receiver.try_recv() {
            seen.push((event.decision, event.connection));
        }
        assert_eq!(seen.iter().filter(|(_, c)| c.is_none()).count(), QUEUE - KEPT_FOR_CONNECTIONS + 2);
        assert_eq!(
            &seen[seen.len() - 3..],
            [(Decision::Allowed, None), (Decision::Failed, None), (Decision::Refused, Some(7))],
            "the connections were dropped"
        );
    }
}
