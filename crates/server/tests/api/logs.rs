//! One JSON log line per request, with the route's template, the status, the duration and the tenant — and never
//! an API key or a request body.

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use serde_json::{Value, json};

use crate::harness::{Harness, KEY_A};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The `request` lines logged while the test ran, parsed.
fn request_lines(captured: &Captured) -> (String, Vec<Value>) {
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines = text
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .filter(|line| line["message"] == "request")
        .collect();
    (text, lines)
}

#[tokio::test(flavor = "current_thread")]
async fn each_request_logs_one_json_line_without_keys_or_bodies() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let h = Harness::new();
    let id = h.create(KEY_A, json!({"metadata": {"secret-body-marker": "v"}})).await;
    h.exec(&id, KEY_A, &["echo", "body-marker-in-argv"]).await;
    h.call("GET", "/v1/sandboxes", None, Body::empty()).await;
    h.call("GET", "/no/such/route?q=1", None, Body::empty()).await;

    let (text, lines) = request_lines(&captured);
    assert_eq!(lines.len(), 4, "{text}");
    let summary: Vec<(&str, &str, u64, Option<&str>)> = lines
        .iter()
        .map(|line| {
            (
                line["method"].as_str().unwrap(),
                line["path"].as_str().unwrap(),
                line["status"].as_u64().unwrap(),
                line["tenant"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("POST", "/v1/sandboxes", 201, Some("alpha")),
            ("POST", "/v1/sandboxes/{id}/exec", 200, Some("alpha")),
            ("GET", "/v1/sandboxes", 401, None),
            ("GET", "/no/such/route", 404, None),
        ]
    );
    for line in &lines {
        assert!(line["duration_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{line}");
    }
    for secret in [KEY_A, "secret-body-marker", "body-marker-in-argv", "q=1"] {
        assert!(!text.contains(secret), "{secret:?} was logged:\n{text}");
    }
    // Paths are templates: the sandbox id is not part of the request lines.
    assert!(lines.iter().all(|line| !line.to_string().contains(&id)), "{text}");
}
