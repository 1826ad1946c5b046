//! E2B's sandbox listing (`GET /v2/sandboxes`, the SDK's `Sandbox.list` paginator) and details (`GET /sandboxes/{id}`,
//! `get_info`), with the fields, filters, order and paging of E2B's API: running and paused sandboxes (both unless
//! `state` says), newest first unless `order=asc`, filtered by `metadata`, `startedAfter` (inclusive) and `template`,
//! paged by `limit` and `nextToken` on (start time, id) keys (`e2b::paging`), and the matching running sandboxes'
//! count in `x-total-running`.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Uri};
use axum::response::Response;
use sandkasten_types::{NetworkMode, NetworkPolicy};
use serde::{Deserialize, Serialize};

use crate::clock::{parse_rfc3339_us, rfc3339};
use crate::e2b::auth::api_tenant;
use crate::e2b::control::{CLIENT_ID, ENVD_VERSION};
use crate::e2b::error::E2bError;
use crate::e2b::lookup::live;
use crate::e2b::paging;
use crate::listing::{Cursor, Order, Page, page};
use crate::sandbox_lifecycle::Lifecycle;
use crate::state::AppState;
use crate::store::{SandboxRecord, SandboxState};

/// E2B's `ListedSandbox` and, with the details only `get_info` answers, `SandboxDetail`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SandboxListed {
    #[serde(rename = "templateID")]
    template_id: String,
    /// The template's name as created (E2B: the template's alias).
    alias: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    started_at: String,
    end_at: String,
    cpu_count: u64,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    state: &'static str,
    envd_version: &'static str,
    metadata: BTreeMap<String, String>,
    /// No volumes exist here: always empty.
    volume_mounts: Vec<serde_json::Value>,
    #[serde(flatten)]
    detail: Option<SandboxDetail>,
}

/// The fields of `SandboxDetail` beyond `ListedSandbox`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SandboxDetail {
    #[serde(skip_serializing_if = "Option::is_none")]
    envd_access_token: Option<String>,
    allow_internet_access: bool,
    /// The base domain of sandbox URLs: none (the facade serves sandboxes on its own listener).
    domain: Option<String>,
    network: NetworkInfo,
    lifecycle: LifecycleInfo,
    /// A paused sandbox's: `full` (with its memory) or `filesystem`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pause_mode: Option<&'static str>,
}

/// E2B's `SandboxNetworkConfig`, as the sandbox's egress policy reads in E2B's terms.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct NetworkInfo {
    allow_out: Vec<String>,
    deny_out: Vec<String>,
    /// Whether its ports serve requests without the traffic access token (`allow_public_traffic` of its policy).
    allow_public_traffic: bool,
    /// Header rules, placeholders as given (never a secret's value).
    #[serde(skip_serializing_if = "Option::is_none")]
    rules: Option<serde_json::Value>,
}

/// E2B's `SandboxLifecycle`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct LifecycleInfo {
    auto_resume: bool,
    on_timeout: &'static str,
}

/// The policy in E2B's terms (the reverse of `e2b::network::policy`): no network is everything denied, an allowlist
/// is everything denied but the listed hosts, open is everything allowed but the denied ones.
fn network_info(policy: &NetworkPolicy) -> (bool, NetworkInfo) {
    let everything = || vec!["0.0.0.0/0".to_owned()];
    let (internet, allow_out, deny_out) = match policy.mode {
        NetworkMode::None => (false, Vec::new(), everything()),
        NetworkMode::Allowlist => (false, policy.allow.clone(), everything()),
        NetworkMode::Open => (true, Vec::new(), policy.deny.clone()),
    };
    let rules = crate::e2b::network::rules_info(&policy.headers);
    (internet, NetworkInfo { allow_out, deny_out, allow_public_traffic: policy.allow_public_traffic, rules })
}

fn lifecycle_info(lifecycle: &Lifecycle) -> LifecycleInfo {
    LifecycleInfo {
        auto_resume: lifecycle.auto_resume,
        on_timeout: if lifecycle.auto_pause { "pause" } else { "kill" },
    }
}

/// The E2B shape of `record`; `detailed` adds what `get_info` answers (the access token, network, lifecycle).
fn listed(state: &AppState, record: SandboxRecord, detailed: bool) -> SandboxListed {
    let session = state.e2b().get(&record.id);
    let limits = &record.spec.limits;
    let paused = record.state == SandboxState::Paused;
    let template = session.as_ref().map_or_else(|| String::from("base"), |s| s.template.clone());
    let detail = detailed.then(|| {
        let (allow_internet_access, network) = network_info(&record.spec.network);
        SandboxDetail {
            envd_access_token: session.map(|s| s.token),
            allow_internet_access,
            // The wildcard domain its ports are served under (`[e2b] domain`), as the create answered it.
            domain: state.effective_config().e2b.domain.clone(),
            network,
            lifecycle: lifecycle_info(&record.lifecycle),
            pause_mode: paused.then_some(if record.pause_snapshot.is_some() { "filesystem" } else { "full" }),
        }
    });
    SandboxListed {
        alias: template.clone(),
        template_id: template,
        sandbox_id: record.id,
        client_id: CLIENT_ID,
        started_at: rfc3339(record.created_ms),
        end_at: rfc3339(record.expires_ms),
        cpu_count: limits.cpus.ceil().max(1.0) as u64,
        memory_mb: limits.memory_bytes >> 20,
        disk_size_mb: limits.disk_bytes >> 20,
        state: if paused { "paused" } else { "running" },
        envd_version: ENVD_VERSION,
        metadata: record.metadata,
        volume_mounts: Vec::new(),
        detail,
    }
}

/// `GET /sandboxes/{id}`: a running or paused sandbox's details.
pub(crate) async fn info(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<SandboxListed>, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let record = live(&state, &tenant, &id).await?;
    Ok(Json(listed(&state, record, true)))
}

/// The query of `GET /v2/sandboxes` (unknown parameters are ignored, as E2B's API does); numbers are read here, so
/// that a bad one is answered in E2B's words.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    order: Option<String>,
    started_after: Option<String>,
    template: Option<String>,
    limit: Option<String>,
    next_token: Option<String>,
}

/// What a list asks for, checked.
struct ListRequest {
    metadata: BTreeMap<String, String>,
    running: bool,
    paused: bool,
    order: Order,
    started_after_us: Option<i64>,
    template: Option<String>,
    limit: usize,
    after: Option<Cursor>,
}

/// E2B sends metadata filters as one url-encoded `k=v&k2=v2` string (keys and values quoted once more).
fn metadata_filter(encoded: &str) -> Result<BTreeMap<String, String>, E2bError> {
    let uri: Uri = format!("/?{encoded}").parse().map_err(|_| E2bError::invalid("Error parsing metadata"))?;
    let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(&uri)
        .map_err(|error| E2bError::invalid(format!("Error parsing metadata: {error}")))?;
    Ok(pairs.into_iter().collect())
}

fn parse_request(query: ListQuery) -> Result<ListRequest, E2bError> {
    let metadata = metadata_filter(query.metadata.as_deref().unwrap_or(""))?;
    // No `state`: both (E2B's default).
    let (mut running, mut paused) = (query.state.is_none(), query.state.is_none());
    for name in query.state.as_deref().unwrap_or("").split(',').filter(|name| !name.is_empty()) {
        match name {
            "running" => running = true,
            "paused" => paused = true,
            _ => {
                return Err(E2bError::invalid(format!(
                    "parameter \"state\" in query has an error: value {name:?} is not one of running, paused"
                )));
            }
        }
    }
    let order = match query.order.as_deref() {
        None | Some("desc") => Order::Desc,
        Some("asc") => Order::Asc,
        Some(other) => {
            return Err(E2bError::invalid(format!("Invalid order parameter: unknown order {other:?} (asc or desc)")));
        }
    };
    let started_after_us = match query.started_after.as_deref() {
        None => None,
        Some(text) => Some(parse_rfc3339_us(text).ok_or_else(|| {
            E2bError::invalid(format!(
                "parameter \"startedAfter\" in query has an error: {text:?} is not an RFC 3339 date-time"
            ))
        })?),
    };
    if query.template.as_deref().is_some_and(|template| template.contains(':')) {
        return Err(E2bError::invalid(
            "Invalid template: tags are not supported here because sandboxes are not tag-scoped",
        ));
    }
    let limit = paging::limit(query.limit.as_deref())?;
    let after = paging::after(query.next_token.as_deref(), order)?;
    Ok(ListRequest { metadata, running, paused, order, started_after_us, template: query.template, limit, after })
}

/// Whether `record` (as `listed` shows it) passes the filters.
fn wanted(request: &ListRequest, record: &SandboxRecord, shown: &SandboxListed) -> bool {
    request.metadata.iter().all(|(key, value)| record.metadata.get(key) == Some(value))
        && request.started_after_us.is_none_or(|bound| record.created_ms.saturating_mul(1000) >= bound)
        && request.template.as_ref().is_none_or(|template| *template == shown.template_id)
}

/// `GET /v2/sandboxes`: the caller's sandboxes (see the module comment).
pub(crate) async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, E2bError> {
    let tenant = api_tenant(&state, &headers)?;
    let Query(query) = query.map_err(|rejection| E2bError::invalid(rejection.body_text()))?;
    let request = parse_request(query)?;
    let mut shown = Vec::new();
    for (asked, wanted_state) in [(request.running, SandboxState::Running), (request.paused, SandboxState::Paused)] {
        if !asked {
            continue;
        }
        let records = state.store().sandboxes(&tenant.name, Some(wanted_state)).await;
        for record in records.map_err(crate::api::error::ApiError::from)? {
            let created_ms = record.created_ms;
            let item = listed(&state, record.clone(), false);
            if wanted(&request, &record, &item) {
                shown.push((created_ms, item));
            }
        }
    }
    let running = shown.iter().filter(|(_, item)| item.state == "running").count();
    let page =
        page(shown, |(ms, item)| (*ms, item.sandbox_id.as_str()), request.order, request.limit, request.after.as_ref());
    let page = Page { items: page.items.into_iter().map(|(_, item)| item).collect::<Vec<_>>(), next: page.next };
    let mut response = paging::answer(page);
    if request.running {
        response.headers_mut().insert("x-total-running", HeaderValue::from(running));
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_are_decoded_twice() -> Result<(), E2bError> {
        // What `urlencode({quote(k): quote(v)})` sends for {"user": "a b", "x": "1&2"}, once decoded by the router.
        let filter = metadata_filter("user=a%20b&x=1%262")?;
        assert_eq!(filter.get("user").map(String::as_str), Some("a b"));
        assert_eq!(filter.get("x").map(String::as_str), Some("1&2"));
        assert!(metadata_filter("")?.is_empty());
        Ok(())
    }

    #[test]
    fn the_network_policy_reads_back_in_e2b_s_terms() {
        let (internet, none) = network_info(&NetworkPolicy::none());
        assert_eq!(
            (internet, none.allow_out.len(), none.deny_out.as_slice()),
            (false, 0, ["0.0.0.0/0".to_owned()].as_slice())
        );
        let allowlist = NetworkPolicy {
            mode: NetworkMode::Allowlist,
            allow: vec!["api.example.com".into()],
            ..NetworkPolicy::none()
        };
        let (internet, info) = network_info(&allowlist);
        assert_eq!(
            (internet, info.allow_out, info.deny_out),
            (false, vec!["api.example.com".to_owned()], vec!["0.0.0.0/0".to_owned()])
        );
        let open = NetworkPolicy {
            mode: NetworkMode::Open,
            allow: Vec::new(),
            deny: vec!["198.51.100.1".into()],
            allow_public_traffic: true,
            headers: Vec::new(),
        };
        let (internet, info) = network_info(&open);
        assert_eq!((internet, info.allow_out.len(), info.deny_out), (true, 0, vec!["198.51.100.1".to_owned()]));
        assert!(info.allow_public_traffic && !none.allow_public_traffic);
    }
}
