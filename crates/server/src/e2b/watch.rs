//! envd's directory watches on the filesystem service: `WatchDir` (a server stream: a `start` event, then one
//! `filesystem` event per change and a `keepalive` every `KEEPALIVE`, until the client goes or the directory does)
//! and the polled watchers `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher` (`watchers`), over the runtime's
//! `watch_dir` (inotify inside the sandbox, as `user`). Events carry `name` (relative to the watched directory) and
//! `type`; entry info (`include_entry`) needs envd 0.6.3, which the facade does not claim, so the SDK never asks.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::Response;
use sandkasten_types::{FsEvent, FsEventKind};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::e2b::auth::{SandboxAccess, runtime_failure};
use crate::e2b::connect;
use crate::e2b::error::{Code, E2bError};
use crate::e2b::paths;
use crate::e2b::watchers::Pending;
use crate::state::AppState;

/// How often an idle `WatchDir` stream says it is alive.
const KEEPALIVE: Duration = Duration::from_secs(30);
/// Event frames in flight between the runtime's watch and the facade.
const IN_FLIGHT: usize = 64;

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct WatchRequest {
    path: String,
    recursive: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct WatcherRequest {
    watcher_id: String,
}

/// envd's `FilesystemEvent` in the proto3 JSON mapping.
fn event_json(event: &FsEvent) -> Value {
    let kind = match event.kind {
        FsEventKind::Create => "EVENT_TYPE_CREATE",
        FsEventKind::Write => "EVENT_TYPE_WRITE",
        FsEventKind::Remove => "EVENT_TYPE_REMOVE",
        FsEventKind::Rename => "EVENT_TYPE_RENAME",
        FsEventKind::Chmod => "EVENT_TYPE_CHMOD",
    };
    json!({ "name": event.name, "type": kind })
}

/// Starts the runtime's watch of the request's directory; its events come on the receiver.
async fn start_watch(
    state: &AppState,
    access: &SandboxAccess,
    request: &WatchRequest,
) -> Result<mpsc::Receiver<Vec<FsEvent>>, E2bError> {
    let path = paths::to_sandbox(if request.path.is_empty() { paths::E2B_HOME } else { &request.path })?;
    let (sender, receiver) = mpsc::channel(IN_FLIGHT);
    if let Err(failure) = state.runtime().watch_dir(&access.id, &path, request.recursive, sender).await {
        return Err(runtime_failure(state, &access.id, failure).await);
    }
    Ok(receiver)
}

/// `WatchDir`: a stream of the directory's events.
pub(super) async fn watch_dir(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: WatchRequest = connect::decode_stream_request(body)?;
    let mut events = match start_watch(state, access, &request).await {
        Ok(events) => events,
        Err(error) => return Ok(connect::failed_stream(error)),
    };
    let (writer, response) = connect::stream();
    tokio::spawn(async move {
        if !writer.send(&json!({ "start": {} })).await {
            return;
        }
        let mut keepalive = tokio::time::interval(KEEPALIVE);
        keepalive.tick().await;
        loop {
            tokio::select! {
                frame = events.recv() => {
                    let Some(frame) = frame else {
                        let gone = E2bError::new(Code::NotFound, "the watched directory was removed or moved away");
                        writer.finish(Some(gone)).await;
                        return;
                    };
                    for event in &frame {
                        if !writer.send(&json!({ "filesystem": event_json(event) })).await {
                            // The client went: dropping `events` stops the watch.
                            return;
                        }
                    }
                }
                _ = keepalive.tick() => {
                    if !writer.send(&json!({ "keepalive": {} })).await {
                        return;
                    }
                }
            }
        }
    });
    Ok(response)
}

/// `CreateWatcher`: a watcher whose events `GetWatcherEvents` collects.
pub(super) async fn create_watcher(
    state: &AppState,
    access: &SandboxAccess,
    body: &[u8],
) -> Result<Response, E2bError> {
    let request: WatchRequest = connect::decode(body)?;
    let mut events = start_watch(state, access, &request).await?;
    let pending = Arc::new(Mutex::new(Pending::default()));
    let feeding = Arc::clone(&pending);
    let feeder = tokio::spawn(async move {
        while let Some(frame) = events.recv().await {
            feeding.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(frame);
        }
        feeding.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).ended = true;
    });
    let id = crate::ids::random_hex(16).map_err(|e| E2bError::new(Code::Internal, e.to_string()))?;
    state.e2b().watchers.insert(id.clone(), &access.id, pending, feeder.abort_handle());
    Ok(connect::unary(&json!({ "watcherId": id })))
}

fn unknown_watcher(id: &str) -> E2bError {
    E2bError::new(Code::NotFound, format!("watcher {id:?} not found (it was removed, or its sandbox ended)"))
}

/// `GetWatcherEvents`: what the watcher collected since the last call.
pub(super) fn get_watcher_events(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: WatcherRequest = connect::decode(body)?;
    let (events, ended) = state
        .e2b()
        .watchers
        .take(&access.id, &request.watcher_id)
        .ok_or_else(|| unknown_watcher(&request.watcher_id))?;
    if ended && events.is_empty() {
        state.e2b().watchers.remove(&access.id, &request.watcher_id);
        return Err(E2bError::new(Code::NotFound, "the watched directory was removed or moved away"));
    }
    Ok(connect::unary(&json!({ "events": events.iter().map(event_json).collect::<Vec<_>>() })))
}

/// `RemoveWatcher`: stops and forgets the watcher.
pub(super) fn remove_watcher(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: WatcherRequest = connect::decode(body)?;
    if !state.e2b().watchers.remove(&access.id, &request.watcher_id) {
        return Err(unknown_watcher(&request.watcher_id));
    }
    Ok(connect::unary(&json!({})))
}
