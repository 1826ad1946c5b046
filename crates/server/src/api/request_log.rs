//! One log line per request: `method`, `path` (the route's template, e.g. `/v1/sandboxes/{id}`, or the raw path
//! when no route matched; never the query string), `status`, `duration_ms` (until the response head: a stream's
//! body may go on after it) and `tenant` once authentication has found it. Headers (API keys) and bodies are never
//! logged. 5xx answers are logged at `warn`, everything else at `info`.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;

/// The tenant a request acted for, left in the response's extensions by the authentication middleware.
#[derive(Debug, Clone)]
pub(crate) struct LoggedTenant(pub(crate) Arc<str>);

/// Longest raw path logged for a request that matched no route.
const MAX_RAW_PATH: usize = 200;

/// The path to log: the matched route's template, or the raw path cut at `MAX_RAW_PATH` bytes.
fn path_of(request: &Request) -> String {
    if let Some(matched) = request.extensions().get::<MatchedPath>() {
        return matched.as_str().to_owned();
    }
    let raw = request.uri().path();
    let mut end = raw.len().min(MAX_RAW_PATH);
    while !raw.is_char_boundary(end) {
        end -= 1;
    }
    raw[..end].to_owned()
}

/// The middleware.
pub(crate) async fn log_request(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = path_of(&request);
    let response = next.run(request).await;
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    let status = response.status().as_u16();
    let tenant = response.extensions().get::<LoggedTenant>().map(|t| Arc::clone(&t.0));
    let tenant = tenant.as_deref();
    if response.status().is_server_error() {
        tracing::warn!(method = %method, path = %path, status, duration_ms, tenant, "request");
    } else {
        tracing::info!(method = %method, path = %path, status, duration_ms, tenant, "request");
    }
    response
}
