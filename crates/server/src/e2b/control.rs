//! E2B's control plane (`E2B_API_URL`): create (`POST /v2/sandboxes`), connect, kill and set the timeout of
//! sandboxes (listing them and their info: `e2b::listing`), with E2B's JSON shapes, over the same store, quotas, warm pools
//! and expiry as the native API. Pause and resume (and `autoPause`/`autoResume`, and `connect` of a paused sandbox)
//! are the native API's (`lifecycle::pause`/`resume`). A create whose template is one of the caller's snapshot ids
//! (`sn-…`) starts the sandbox on that snapshot's files (`snapshots`).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use sandkasten_types::{Limits, NetworkPolicy, SandboxSpec, Template};
use serde::{Deserialize, Serialize};

use crate::auth::Tenant;
use crate::e2b::auth::api_tenant;
use crate::e2b::error::{Code, E2bError, json_body};
use crate::e2b::lookup::{TEMPLATES, live, running};
use crate::e2b::{network, snapshots};
use crate::ids::is_snapshot_id;
use crate::lifecycle::{self, check_timeout, end_running, start_sandbox};
use crate::sandbox_lifecycle::PauseMode;
use crate::state::AppState;
use crate::store::{Lifecycle, SandboxRecord, SandboxState};
use crate::store_snapshots::SnapshotRecord;
use crate::validate;

/// The envd version the facade claims: it decides which features the SDK uses (stdin, close_stdin, octet-stream
/// uploads, 0.6.2's file metadata and 0.6.3's entry info in watch events yes; 0.6.4's network-mount watches no:
/// a sandbox has no network mounts to watch, and the SDKs refuse that option themselves below 0.6.4).
pub(crate) const ENVD_VERSION: &str = "0.6.3";
/// The client id answered (E2B's is an internal node id).
pub(crate) const CLIENT_ID: &str = "sandkasten";
/// Longest a facade command or cell may run (its sandbox's `limits.timeout_ms`): E2B programs run servers and long
/// jobs, and bound them with their own timeouts.
const FACADE_COMMAND_TIMEOUT_MS: u64 = 3_600_000;

/// `POST /v2/sandboxes` body (fields the facade does not know are ignored, as E2B's API does).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(default)]
    auto_pause: bool,
    /// `{"enabled": bool}`.
    #[serde(default)]
    auto_resume: Option<AutoResume>,
    /// `false` asks for a filesystem-only pause at the timeout (`PauseMode::Filesystem`).
    #[serde(default)]
    auto_pause_memory: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<serde_json::Value>,
    // `mcp` is read by no one: see `refuse_unsupported`.
    volume_mounts: Option<Vec<serde_json::Value>>,
}

/// E2B's `SandboxAutoResumeConfig`.
#[derive(Debug, Deserialize)]
pub(crate) struct AutoResume {
    #[serde(default)]
    enabled: bool,
}

/// E2B's `Sandbox` (create and connect answer).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SandboxCreated {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    envd_version: &'static str,
    envd_access_token: String,
    traffic_access_token: String,
    domain: Option<String>,
}

/// `{"timeout": seconds}` of set_timeout and connect.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct TimeoutBody {
    #[serde(default)]
    timeout: Option<u64>,
}

/// What the facade refuses at create. `mcp` is not among them: E2B's API only creates the sandbox (from the
/// `mcp-gateway` template) and the SDK then starts `mcp-gateway` in it as root; sandkasten has no gateway, so that
/// command fails and the SDK raises its own "Failed to start MCP gateway: …" and kills the sandbox, as it does
/// when E2B's gateway fails.
fn refuse_unsupported(body: &NewSandbox) -> Result<(), E2bError> {
    if body.volume_mounts.as_ref().is_some_and(|mounts| !mounts.is_empty()) {
        return Err(E2bError::unsupported("volume mounts"));
    }
    Ok(())
}

/// A facade sandbox: the `e2b` template, long commands, the network policy its E2B options ask for
/// (`e2b::network`: with none, no network, sandkasten's default), and the server's default isolation tier (E2B's API
/// has no way to name one; `start_sandbox` fills it in).
fn facade_spec(env: BTreeMap<String, String>, network: NetworkPolicy) -> SandboxSpec {
    SandboxSpec {
        template: Template::E2b,
        limits: Limits { timeout_ms: FACADE_COMMAND_TIMEOUT_MS, ..Limits::default() },
        env,
        network,
        ..SandboxSpec::default()
    }
}

/// A sandbox made from `snapshot` (of an `e2b` template sandbox) starts like its source: the same tier and limits
/// (the disk its files need), with a facade sandbox's bound on commands.
fn on_snapshot(spec: &mut SandboxSpec, snapshot: &SnapshotRecord) {
    spec.isolation = snapshot.spec.isolation;
    spec.limits = Limits { timeout_ms: FACADE_COMMAND_TIMEOUT_MS, ..snapshot.spec.limits.clone() };
}

/// E2B's `Sandbox` for a sandbox the caller may now use: its session opened (with a new access token unless it has
/// one), `template` recorded when given.
pub(crate) fn session_of(
    state: &AppState,
    record: &SandboxRecord,
    tenant: &Tenant,
    template: Option<&str>,
) -> Result<SandboxCreated, E2bError> {
    let session = state.e2b().open(&record.id, tenant, template).map_err(crate::api::error::ApiError::from)?;
    Ok(SandboxCreated {
        template_id: session.template,
        sandbox_id: record.id.clone(),
        client_id: CLIENT_ID,
        envd_version: ENVD_VERSION,
        envd_access_token: session.token.clone(),
        traffic_access_token: session.token,
        domain: state.effective_config().e2b.domain.clone(),
    })
}

fn created(
    state: &AppState,
    record: &SandboxRecord,
    tenant: &Tenant,
    template: Option<&str>,
) -> Result<Response, E2bError> {
    Ok((StatusCode::CREATED, Json(session_of(state, record, tenant, template)?)).into_response())
}

/// `POST /v2/sandboxes` (and `/sandboxes`): create a sandbox.
pub(crate) async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let body: NewSandbox = crate::e2b::error::parse_json(&body)?;
    refuse_unsupported(&body)?;
    let snapshot = if is_snapshot_id(&body.template_id) {
        Some(snapshots::for_create(&state, &tenant, &body.template_id).await?)
    } else {
        None
    };
    // The built template the sandbox is made of: the one named, or the one a files snapshot's source was made of (a
    // memory snapshot's sandbox goes on with the source's spec).
    let built_name = match &snapshot {
        Some(snapshot) if snapshot.memory => None,
        Some(snapshot) => snapshot.spec.layers.name.clone(),
        None if TEMPLATES.contains(&body.template_id.as_str()) => None,
        None => Some(body.template_id.clone()),
    };
    let mut built = None;
    let mut choosing = None;
    if let Some(name) = &built_name {
        state
            .shared_templates()
            .fetch(state.effective_config(), Some(name))
            .await
            .map_err(crate::api::error::ApiError::from)?;
        // A template removal waits while the template is chosen, then keeps the layers chosen until the sandbox's
        // row names them (`template_use`).
        choosing = state.choosing_template(Some(name)).await;
        let templates = &state.effective_config().templates;
        match crate::built_templates::choose(templates, Some(name)) {
            // A template built on this server: its layers at `/opt`, in the facade's layout.
            Ok(chosen) => built = Some(crate::built_templates::Chosen { layout: Template::E2b, ..chosen }),
            Err(crate::built_templates::ChooseError::Unknown(_)) if snapshot.is_some() => {
                return Err(E2bError::invalid(format!(
                    "snapshot {} holds the files of a sandbox of template {name:?}, which is no longer built on \
                     this server: build it again (`sandkasten template build --cache {}`) to restore it",
                    body.template_id,
                    templates.cache_root().display()
                )));
            }
            Err(crate::built_templates::ChooseError::Unknown(_)) => {
                return Err(E2bError::new(
                    Code::NotFound,
                    format!(
                        "template {:?} not found: sandkasten serves {}, the templates built on this server \
                         (`sandkasten template build --cache {}`) and your snapshots (sn-…)",
                        body.template_id,
                        TEMPLATES.join(", "),
                        templates.cache_root().display()
                    ),
                ));
            }
            Err(error) => return Err(crate::api::error::ApiError::from(error).into()),
        }
    }
    let env = body.env_vars.unwrap_or_default();
    let metadata = body.metadata.unwrap_or_default();
    validate::environment(&env).map_err(E2bError::invalid)?;
    validate::metadata(&metadata).map_err(E2bError::invalid)?;
    let settings = state.settings();
    let expires_ms = check_timeout(settings, body.timeout.unwrap_or(settings.default_timeout_s))?;
    let network = network::policy(body.allow_internet_access, body.network.as_ref())?;
    let lifecycle = Lifecycle {
        auto_pause: body.auto_pause,
        auto_resume: body.auto_resume.is_some_and(|a| a.enabled),
        pause_mode: pause_mode(body.auto_pause_memory),
    };
    if let Some(snapshot) = snapshot.as_ref().filter(|snapshot| snapshot.memory) {
        // A memory snapshot's processes go on with the environment they had: the spec is the source's.
        let record = lifecycle::start_from_memory(&state, &tenant, snapshot, metadata, (expires_ms, lifecycle)).await?;
        return created(&state, &record, &tenant, Some(&body.template_id));
    }
    let mut spec = facade_spec(env, network);
    if let Some(built) = built {
        built.apply(&mut spec);
    }
    let starting = choosing.map(|choosing| choosing.starting(&spec.layers.layers));
    if let Some(snapshot) = &snapshot {
        on_snapshot(&mut spec, snapshot);
    }
    let record = match &snapshot {
        Some(snapshot) => {
            let expiry = (expires_ms, lifecycle);
            lifecycle::start_on_files(&state, &tenant, spec, metadata, expiry, snapshot, starting).await?
        }
        None => {
            let started = start_sandbox(&state, &tenant, spec, metadata, (expires_ms, lifecycle)).await?;
            drop(starting);
            started
        }
    };
    created(&state, &record, &tenant, Some(&body.template_id))
}

/// `POST /sandboxes/{id}/pause` body (none from older SDKs).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct PauseBody {
    #[serde(default)]
    memory: Option<bool>,
}

/// E2B's `memory: false` (`keep_memory=False`, lifecycle `mode: "filesystem"`) is a filesystem pause.
fn pause_mode(memory: Option<bool>) -> PauseMode {
    if memory == Some(false) { PauseMode::Filesystem } else { PauseMode::Memory }
}

/// `POST /sandboxes/{id}/pause`: 204; 409 when it is paused already (the SDK answers `False`). `memory: false` pauses
/// to the filesystem (its files kept, everything else released; the resume starts fresh processes on them).
pub(crate) async fn pause(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<StatusCode, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let memory = json_body::<PauseBody>(&body)?.memory;
    let record = live(&state, &tenant, &id).await?;
    if record.state == SandboxState::Paused {
        return Err(E2bError::new(Code::AlreadyExists, format!("sandbox {id} is already paused")));
    }
    lifecycle::pause(&state, &tenant, &id, pause_mode(memory)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/resume` (the SDK's older resume): 201 with the sandbox; 409 when it is not paused.
pub(crate) async fn resume(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let record = live(&state, &tenant, &id).await?;
    if record.state != SandboxState::Paused {
        return Err(E2bError::new(Code::AlreadyExists, format!("sandbox {id} is not paused (it runs)")));
    }
    lifecycle::resume(&state, &tenant, &id).await?;
    created(&state, &record, &tenant, None)
}

/// `POST /v2/sandboxes/{id}/connect` (and `/sandboxes/{id}/connect`): reconnect to a running sandbox; its timeout
/// is extended to `timeout` seconds from now when that is later.
pub(crate) async fn connect(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let record = live(&state, &tenant, &id).await?;
    if record.state == SandboxState::Paused {
        // Connecting to a paused sandbox resumes it (E2B's behaviour).
        lifecycle::ensure_resumed(&state, &tenant, &id).await?;
    }
    let record = running(&state, &tenant, &id).await?;
    if let Some(timeout) = json_body::<TimeoutBody>(&body)?.timeout {
        let expires_ms = check_timeout(state.settings(), timeout)?;
        if expires_ms > record.expires_ms {
            state.store().set_expiry(&tenant.name, &id, expires_ms).await.map_err(crate::api::error::ApiError::from)?;
        }
    }
    let mut response = created(&state, &record, &tenant, None)?;
    *response.status_mut() = StatusCode::OK;
    Ok(response)
}

/// `POST /sandboxes/{id}/timeout`: the sandbox ends `timeout` seconds from now.
pub(crate) async fn set_timeout(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<StatusCode, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    running(&state, &tenant, &id).await?;
    let timeout =
        json_body::<TimeoutBody>(&body)?.timeout.ok_or_else(|| E2bError::invalid("give the timeout in seconds"))?;
    let expires_ms = check_timeout(state.settings(), timeout)?;
    if !state.store().set_expiry(&tenant.name, &id, expires_ms).await.map_err(crate::api::error::ApiError::from)? {
        return Err(E2bError::sandbox_not_found(&id));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /sandboxes/{id}`: kill a sandbox (404 when it is unknown or has ended, which the SDK reports as `False`).
pub(crate) async fn kill(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    live(&state, &tenant, &id).await?;
    end_running(&state, &tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /sandboxes/{id}/network` (`Sandbox.update_network`): the whole egress configuration replaced, live, as a
/// create's `network` and `allow_internet_access` map (`network::policy`; leaving everything out means no network, as
/// at create; `allowPublicTraffic` is kept as created). 204.
pub(crate) async fn update_network(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<StatusCode, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    // Empty is `null`: nothing asked, as `{}`.
    let body: serde_json::Value = json_body(&body)?;
    for unsupported in ["egressProxy", "dnsServers"] {
        if body.get(unsupported).is_some_and(|value| !value.is_null()) {
            return Err(E2bError::unsupported(&format!("network.{unsupported}")));
        }
    }
    let internet = body.get("allow_internet_access").and_then(serde_json::Value::as_bool);
    let asked = body.as_object().is_some_and(|fields| fields.keys().any(|key| key != "allow_internet_access"));
    let mut policy = network::policy(internet, asked.then_some(&body))?;
    let record = live(&state, &tenant, &id).await?;
    // Inbound access is chosen at create (as in E2B): an egress update keeps it.
    policy.allow_public_traffic = record.spec.network.allow_public_traffic;
    crate::api::egress::change_policy(&state, &tenant, &id, policy).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Refreshes and logs: 501.
pub(crate) async fn unsupported(State(state): State<AppState>, headers: HeaderMap, uri: Uri) -> E2bError {
    if let Err(error) = api_tenant(&state, &headers) {
        return error;
    }
    let what = uri.path().rsplit('/').next().unwrap_or("this operation");
    E2bError::unsupported(&format!("{what} (sandboxes have no logs or refreshes)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_shape_is_what_the_sdk_parses() -> Result<(), serde_json::Error> {
        let body = SandboxCreated {
            template_id: "base".into(),
            sandbox_id: "sb-1".into(),
            client_id: CLIENT_ID,
            envd_version: ENVD_VERSION,
            envd_access_token: "t".into(),
            traffic_access_token: "t".into(),
            domain: None,
        };
        let json = serde_json::to_value(&body)?;
        for key in ["templateID", "sandboxID", "clientID", "envdVersion", "envdAccessToken", "trafficAccessToken"] {
            assert!(json.get(key).is_some(), "{key} missing from {json}");
        }
        Ok(())
    }
}
