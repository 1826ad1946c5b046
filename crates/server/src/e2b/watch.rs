//! envd's directory watches on the filesystem service: `WatchDir` (a server stream: a `start` event, then one
//! `filesystem` event per change and a `keepalive` every `KEEPALIVE`, until the client goes or the directory does)
//! and the polled watchers `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher` (`watchers`), over the runtime's
//! `watch_dir` (inotify inside the sandbox, as `user`). Events carry `name` (relative to the watched directory) and
//! `type`, and with `include_entry` (envd 0.6.3) the entry's `EntryInfo`, stat-ed as `user` when the event arrives
//! (none where the entry is gone: a remove, the old name of a rename), as envd does.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::Response;
use sandkasten_types::{CommandUser, FsEvent, FsEventKind};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::e2b::auth::{SandboxAccess, runtime_failure};
use crate::e2b::error::{Code, E2bError};
use crate::e2b::paths;
use crate::e2b::watchers::Pending;
use crate::e2b::{connect, entries};
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
    /// Each event carries the entry's `EntryInfo` when it can be stat-ed.
    include_entry: bool,
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

/// What a watch of the directory `root` in sandbox `id` answers for `frame`: envd's events, each with its entry's
/// info when `include_entry` asked and the entry is there to stat (as the watching `user`).
async fn frame_json(state: &AppState, id: &str, root: &str, include_entry: bool, frame: &[FsEvent]) -> Vec<Value> {
    let mut shown = Vec::with_capacity(frame.len());
    for event in frame {
        let mut value = event_json(event);
        if include_entry && event.kind != FsEventKind::Remove {
            let path = if event.name.is_empty() { root.to_owned() } else { format!("{root}/{}", event.name) };
            let user = CommandUser::Sandbox;
            if let Ok(info) = state.runtime().stat_as(id, &path, user).await
                && let Ok(entry) = entries::entry(state, id, &info, user).await
            {
                value["entry"] = entry;
            }
        }
        shown.push(value);
    }
    shown
}

/// Starts the runtime's watch of the request's directory; its events come on the receiver. Also returns the
/// directory's path in the sandbox.
async fn start_watch(
    state: &AppState,
    access: &SandboxAccess,
    request: &WatchRequest,
) -> Result<(String, mpsc::Receiver<Vec<FsEvent>>), E2bError> {
    let path = paths::to_sandbox(if request.path.is_empty() { paths::E2B_HOME } else { &request.path })?;
    let (sender, receiver) = mpsc::channel(IN_FLIGHT);
    if let Err(failure) = state.runtime().watch_dir(&access.id, &path, request.recursive, sender).await {
        return Err(runtime_failure(state, &access.id, failure).await);
    }
    Ok((path, receiver))
}

/// `WatchDir`: a stream of the directory's events.
pub(super) async fn watch_dir(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: WatchRequest = connect::decode_stream_request(body)?;
    let (root, mut events) = match start_watch(state, access, &request).await {
        Ok(watch) => watch,
        Err(error) => return Ok(connect::failed_stream(error)),
    };
    let (writer, response) = connect::stream();
    let (state, id) = (state.clone(), access.id.clone());
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
                    for event in frame_json(&state, &id, &root, request.include_entry, &frame).await {
                        if !writer.send(&json!({ "filesystem": event })).await {
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
                // The client stopped the watch (`handle.stop()` closes the stream): free its place in the sandbox's
                // watches now, not at the next event or keepalive.
                () = writer.closed() => return,
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
    let (root, mut events) = start_watch(state, access, &request).await?;
    let pending = Arc::new(Mutex::new(Pending::default()));
    let feeding = Arc::clone(&pending);
    let (state_for_feeder, id) = (state.clone(), access.id.clone());
    let feeder = tokio::spawn(async move {
        while let Some(frame) = events.recv().await {
            let shown = frame_json(&state_for_feeder, &id, &root, request.include_entry, &frame).await;
            feeding.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(shown);
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
    Ok(connect::unary(&json!({ "events": events })))
}

/// `RemoveWatcher`: stops and forgets the watcher.
pub(super) fn remove_watcher(state: &AppState, access: &SandboxAccess, body: &[u8]) -> Result<Response, E2bError> {
    let request: WatcherRequest = connect::decode(body)?;
    if !state.e2b().watchers.remove(&access.id, &request.watcher_id) {
        return Err(unknown_watcher(&request.watcher_id));
    }
    Ok(connect::unary(&json!({})))
}
