//! `POST /v1/templates`: builds a template on the server (admin tenants only: templates are shared by every tenant
//! and builds reach the package registries). The body is a spec (`template.toml` text or the same fields as JSON) or
//! a Dockerfile, with the files it copies; a bad spec is refused (422 naming the field) before anything runs, a
//! running build holds the cache (409). The answer is a stream of server-sent events, the build's events
//! (`step`, `output`, `layer`, `ready`, then `done` or `failed`; `error` if sandkasten itself failed), the same
//! objects `sandkasten template build --json` prints. The build runs to its end even when the client goes; each
//! step runs in a build sandbox of the server's runtime, one at a time (the cache's lock), outside the tenants'
//! quotas. A stopping server cancels the build (its sandbox destroyed) and ends the stream. Output events are dropped
//! while a slow client leaves `OUTPUT_QUEUED` bytes of events unread (a failing step's tail is in `failed`).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use sandkasten_template::{TemplateCache, TemplateSpec, cache::CacheLock, dockerfile, steps::MAX_FILE_BYTES};
use sandkasten_template_build::{BuildError, BuildEvent, BuildOptions, Plan};
use serde::Deserialize;
use tokio::sync::mpsc;
use utoipa::ToSchema;

use crate::api::error::{ApiError, ErrorBody, ErrorCode, ErrorDetail};
use crate::api::extract::JsonBody;
use crate::api::output::json_event;
use crate::auth::Tenant;
use crate::state::AppState;

/// The Python whose pip configuration names the registries when `[templates] registries` is unset.
const HOST_PYTHON: &str = "/usr/bin/python3";
/// Events queued for a client, bytes, past which output events are dropped until it catches up.
const OUTPUT_QUEUED: u64 = 1 << 20;
/// What one queued event costs besides its JSON (the event, its name, the queue's slot), bytes.
const EVENT_OVERHEAD: u64 = 128;
/// How long a stream waits, once the server stops, for the build's last event before it ends anyway.
const STOPPING_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// A template to build.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BuildRequest {
    /// The spec: a `template.toml` text, or an object with the same fields (`name`, `base`, `packages`, `files`,
    /// `env`, `workdir`, `user`, `run`, `ready`, `preload`). Give this or `dockerfile`.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub spec: Option<serde_json::Value>,
    /// A Dockerfile of the supported subset (`FROM`, `RUN`, `COPY`, `ENV`, `WORKDIR`, `USER`) instead of a spec;
    /// `name` is then required.
    #[serde(default)]
    pub dockerfile: Option<String>,
    /// The template's name (overrides the spec's).
    #[serde(default)]
    pub name: Option<String>,
    /// The files the spec's `[[files]]` (a Dockerfile's `COPY`) name, by their `src`: the contents in standard
    /// base64, at most 8 MiB each, the whole body within the server's `max_json_bytes` (default 4 MiB).
    #[serde(default)]
    pub files: BTreeMap<String, String>,
}

impl BuildRequest {
    /// The spec and its files, or a 422 naming what is wrong.
    fn parse(self) -> Result<(TemplateSpec, BTreeMap<String, Vec<u8>>), ApiError> {
        let bad = |error: sandkasten_template::SpecError| ApiError::unprocessable(format!("the template: {error}"));
        let mut spec = match (self.spec, self.dockerfile) {
            (Some(serde_json::Value::String(text)), None) => TemplateSpec::from_toml(&text).map_err(bad)?,
            (Some(value @ serde_json::Value::Object(_)), None) => TemplateSpec::from_json(value).map_err(bad)?,
            (Some(_), None) => {
                return Err(ApiError::unprocessable(
                    "spec: give the template.toml text as a string, or its fields as an object",
                ));
            }
            (None, Some(text)) => {
                let name = self.name.as_deref().ok_or_else(|| {
                    ApiError::unprocessable("name: required with a dockerfile (it names the template)")
                })?;
                dockerfile::translate(&text, name).map_err(bad)?
            }
            (None, None) => {
                return Err(ApiError::unprocessable(
                    "nothing to build: give `spec` (template.toml text or an object) or `dockerfile`",
                ));
            }
            (Some(_), Some(_)) => {
                return Err(ApiError::unprocessable("give either `spec` or `dockerfile`, not both"));
            }
        };
        if let Some(name) = self.name {
            spec.name = name;
            spec.validate().map_err(bad)?;
        }
        let mut files = BTreeMap::new();
        for (src, encoded) in self.files {
            let contents = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|error| ApiError::unprocessable(format!("files.{src}: not standard base64 ({error})")))?;
            if contents.len() as u64 > MAX_FILE_BYTES {
                return Err(ApiError::unprocessable(format!(
                    "files.{src}: {} bytes; a file may have at most {MAX_FILE_BYTES}",
                    contents.len()
                )));
            }
            files.insert(src, contents);
        }
        Ok((spec, files))
    }
}

/// What a build needs once it is accepted: the cache (its lock held), the plan and the options.
struct Accepted {
    cache: TemplateCache,
    lock: CacheLock,
    plan: Plan,
    options: BuildOptions,
}

/// Build a template from a spec or a Dockerfile (admin tenants only); the build's progress as server-sent events.
#[utoipa::path(
    post, path = "/v1/templates", tag = "templates",
    request_body = BuildRequest,
    responses(
        (status = 200, description = "The build's events as server-sent events: `step`, `output`, `download`, \
            `layer` and `ready` as it goes (data: BuildEvent), then `done` or `failed` (data: BuildEvent; `failed` \
            names the step and carries its output's tail: nothing was made), or `error` (data: ErrorDetail) when \
            sandkasten itself failed", content((BuildEvent = "text/event-stream"))),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The tenant is not an admin", body = ErrorBody),
        (status = 409, description = "Another build holds the template cache: try again when it finished",
            body = ErrorBody),
        (status = 413, description = "The body is larger than the server's JSON limit", body = ErrorBody),
        (status = 422, description = "A bad spec or Dockerfile (unknown key, wrong type, missing or unbuilt base, a \
            file not given or not base64), named by its field; nothing ran", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn build(
    State(state): State<AppState>,
    tenant: Tenant,
    JsonBody(body): JsonBody<BuildRequest>,
) -> Result<Response, ApiError> {
    if !tenant.admin {
        return Err(ApiError::forbidden(format!(
            "tenant {:?} may not build templates: they are shared by all tenants; only a tenant with admin = true in \
             the server's config may",
            tenant.name
        )));
    }
    let (spec, files) = body.parse()?;
    let config = state.effective_config();
    let root = config.templates.cache_root();
    let configured = config.templates.registries.clone();
    let egress = config.egress.clone();
    let accepted = tokio::task::spawn_blocking(move || accept(&root, spec, &files, configured, egress))
        .await
        .map_err(ApiError::internal)??;
    let name = accepted.plan.spec().name.clone();
    tracing::info!(template = %name, tenant = %tenant.name, steps = accepted.plan.steps().len(), "template build started");
    // Each queued event with its output bytes, which the stream gives back as it sends them.
    let (sender, receiver) = mpsc::unbounded_channel::<(Event, u64)>();
    let queued = Arc::new(AtomicU64::new(0));
    let runtime = state.shared_runtime();
    let config = state.effective_config();
    let share = match config.templates.share {
        true => Some(
            sandkasten_template_build::TemplateStore::beside(&config.snapshots.store_config(&config.database))
                .map_err(|error| ApiError::new(ErrorCode::StoreFailed, format!("the template store: {error}")))?,
        ),
        false => None,
    };
    let producer_queued = Arc::clone(&queued);
    let stopping = state.stopping().clone();
    tokio::spawn(async move {
        let Accepted { cache, lock, plan, options } = accepted;
        let send = |event: BuildEvent| {
            // What the queued event holds: its JSON (escaping included) and the event's own overhead.
            let text = serde_json::to_string(&event).unwrap_or_default();
            let size = text.len() as u64 + EVENT_OVERHEAD;
            let output = matches!(event, BuildEvent::Output { .. });
            if output && producer_queued.load(Ordering::Relaxed) + size > OUTPUT_QUEUED {
                return;
            }
            producer_queued.fetch_add(size, Ordering::Relaxed);
            let _ = sender.send((Event::default().event(event.name()).data(text), size));
        };
        let outcome = tokio::select! {
            outcome = sandkasten_template_build::build(&runtime, &cache, &options, &plan, &send) => Some(outcome),
            // Dropping the build destroys the step's sandbox (`BuildSandbox`'s drop); the next start clears its
            // capture if the unmount did not finish.
            () = stopping.cancelled() => None,
        };
        let Some(outcome) = outcome else {
            drop(lock);
            tracing::info!(template = %name, "template build cancelled: the server is stopping");
            let cancelled = ApiError::new(
                ErrorCode::Internal,
                "the server is stopping: the build was cancelled and made nothing; build again once it is back",
            );
            let _ = sender.send((json_event("error", &ErrorDetail::from(cancelled)), 0));
            return;
        };
        // With `[templates] share`, the template goes to the template store before the build is reported done.
        let pushed = match (&share, &outcome) {
            (Some(store), Ok(record)) => tokio::select! {
                pushed = store.push(&cache, &record.name) => pushed.map(|_| ()),
                () = stopping.cancelled() => Err(sandkasten_template_build::ShareError::Io {
                    doing: "pushing".to_owned(),
                    source: std::io::Error::other("the server is stopping"),
                }),
            },
            _ => Ok(()),
        };
        if let Err(error) = pushed {
            drop(lock);
            let failed = ApiError::new(
                ErrorCode::StoreFailed,
                format!("template {name} was built on this host but not pushed to the template store: {error}"),
            );
            let _ = sender.send((json_event("error", &ErrorDetail::from(failed)), 0));
            return;
        }
        drop(lock);
        match BuildEvent::finished(&name, &outcome) {
            Some(event) => send(event),
            None => {
                let message = outcome.err().map(|error| error.to_string()).unwrap_or_default();
                let _ = sender.send((json_event("error", &ErrorDetail::from(ApiError::internal(message))), 0));
                return;
            }
        }
        tracing::info!(template = %name, "template build ended");
    });
    let events = futures::stream::unfold((receiver, queued), |(mut receiver, queued)| async move {
        let (event, size) = receiver.recv().await?;
        queued.fetch_sub(size, Ordering::Relaxed);
        Some((Ok::<Event, Infallible>(event), (receiver, queued)))
    });
    // The stream ends with the build's last event; when the server stops, that comes at once (the build is
    // cancelled), and the stream ends anyway after a grace (the graceful shutdown waits for open responses).
    let stopping = state.stopping().clone();
    let events = futures::StreamExt::take_until(events, async move {
        stopping.cancelled().await;
        tokio::time::sleep(STOPPING_GRACE).await;
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}

/// Takes the cache's lock (409 while another build holds it), clears what killed builds left, plans the build (422
/// for a spec problem) and settles its options from the server's config.
fn accept(
    root: &std::path::Path,
    spec: TemplateSpec,
    files: &BTreeMap<String, Vec<u8>>,
    configured: Vec<String>,
    egress: sandkasten_egress::EgressConfig,
) -> Result<Accepted, ApiError> {
    let cache = TemplateCache::open(root).map_err(ApiError::internal)?;
    let plan = |spec: TemplateSpec| {
        Plan::new(&cache, spec, files).map_err(|error| match error {
            BuildError::Spec(error) => ApiError::unprocessable(format!("the template: {error}")),
            other => ApiError::internal(other),
        })
    };
    // A spec problem is 422 whether or not a build runs; the plan is made again under the lock, which a build of
    // the base template would have held.
    plan(spec.clone())?;
    let lock = cache.try_lock().map_err(ApiError::internal)?.ok_or_else(|| {
        ApiError::conflict("another template build holds the template cache: try again when it finished")
    })?;
    sandkasten_template_build::clean_leftovers(&cache);
    let plan = plan(spec)?;
    let registries = if configured.is_empty() {
        sandkasten_template::registries::discover(plan.spec(), HOST_PYTHON)
    } else {
        configured
    };
    let mut options = BuildOptions::new(registries);
    options.trust = sandkasten_template::registries::client_trust(plan.spec(), HOST_PYTHON);
    options.egress = egress;
    Ok(Accepted { cache, lock, plan, options })
}
