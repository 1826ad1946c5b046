//! envd's HTTP routes: `GET /files?path=` downloads a file, `POST /files` uploads one or more (multipart, each part
//! named by its file name, or a raw `application/octet-stream` body with `?path=`), creating missing parent
//! directories as envd does; `GET /health` answers 204 while the sandbox runs and 502 otherwise. Errors are envd's
//! `{"code", "message"}` with the status the SDK maps (404 is `FileNotFoundException`).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sandkasten_types::FailureKind;
use serde::{Deserialize, Serialize};

use crate::e2b::auth::{SandboxAccess, request_user, require_default_user, runtime_failure, sandbox_access};
use crate::e2b::error::{Code, E2bError};
use crate::e2b::paths;
use crate::state::AppState;

/// The query of `/files`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
}

/// One written file, as envd answers it.
#[derive(Debug, Serialize)]
pub(crate) struct WriteInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
}

fn user_of(query: &FilesQuery, headers: &HeaderMap) -> Result<(), E2bError> {
    match &query.username {
        Some(user) => require_default_user(user),
        None => require_default_user(&request_user(headers)?),
    }
}

/// `GET /health`.
pub(crate) async fn health(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match sandbox_access(&state, &headers).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        // The status alone, as envd answers; counted like every other error.
        Err(error) => {
            let mut response = error.code.status().into_response();
            response.extensions_mut().insert(crate::api::error::ErrorTag(error.code.as_str()));
            response
        }
    }
}

/// `GET /files?path=`: the file's bytes.
pub(crate) async fn download(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<FilesQuery>, QueryRejection>,
) -> Result<Response, E2bError> {
    let access = sandbox_access(&state, &headers).await?;
    let Query(query) = query.map_err(|rejection| E2bError::invalid(rejection.body_text()))?;
    user_of(&query, &headers)?;
    let wanted = query.path.as_deref().ok_or_else(|| E2bError::invalid("give the file as ?path="))?;
    let path = paths::to_sandbox(wanted)?;
    let max = state.settings().max_file_bytes;
    match state.runtime().read_file(&access.id, &path, max).await {
        Ok(data) => Ok(([(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"))], data).into_response()),
        Err(failure) if failure.kind == FailureKind::NotFound => {
            Err(E2bError::new(Code::NotFound, format!("path '{wanted}' does not exist")))
        }
        Err(failure) => Err(runtime_failure(&state, &access.id, failure).await),
    }
}

async fn write_one(
    state: &AppState,
    access: &SandboxAccess,
    wanted: &str,
    data: Vec<u8>,
) -> Result<WriteInfo, E2bError> {
    let path = paths::to_sandbox(wanted)?;
    if let Some((parent, _)) = path.rsplit_once('/')
        && !parent.is_empty()
        && let Err(failure) = state.runtime().mkdir(&access.id, parent, true).await
        && failure.kind != FailureKind::AlreadyExists
    {
        return Err(runtime_failure(state, &access.id, failure).await);
    }
    if let Err(failure) = state.runtime().write_file(&access.id, &path, data).await {
        return Err(runtime_failure(state, &access.id, failure).await);
    }
    let name = path.rsplit('/').next().unwrap_or_default().to_owned();
    Ok(WriteInfo { name, kind: "file", path: path.clone() })
}

/// `POST /files`: write one file (octet-stream with `?path=`) or several (multipart).
pub(crate) async fn upload(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<FilesQuery>, QueryRejection>,
    request: Request,
) -> Result<Json<Vec<WriteInfo>>, E2bError> {
    let access = sandbox_access(&state, &headers).await?;
    let Query(query) = query.map_err(|rejection| E2bError::invalid(rejection.body_text()))?;
    user_of(&query, &headers)?;
    let encoding = headers.get("content-encoding").map(|value| value.as_bytes().to_ascii_lowercase());
    let gzip = match encoding.as_deref() {
        None | Some(b"identity") => false,
        Some(b"gzip") => true,
        Some(_) => return Err(E2bError::unsupported("an upload compressed other than with gzip")),
    };
    let content_type = headers.get(CONTENT_TYPE).and_then(|value| value.to_str().ok()).unwrap_or_default();
    let max = state.settings().max_file_bytes;
    let too_large = || E2bError::new(Code::ResourceExhausted, format!("the upload is larger than {max} bytes"));
    if !content_type.starts_with("multipart/form-data") {
        let wanted = query.path.ok_or_else(|| E2bError::invalid("give the file as ?path="))?;
        let body = axum::body::to_bytes(request.into_body(), usize::try_from(max).unwrap_or(usize::MAX))
            .await
            .map_err(|_| too_large())?;
        let data = if gzip { gunzip(&body, max)? } else { body.to_vec() };
        return Ok(Json(vec![write_one(&state, &access, &wanted, data).await?]));
    }
    if gzip {
        // The SDK compresses octet-stream uploads only.
        return Err(E2bError::unsupported("a gzip-compressed multipart upload (send it as application/octet-stream)"));
    }
    let mut multipart =
        Multipart::from_request(request, &()).await.map_err(|rejection| E2bError::invalid(rejection.body_text()))?;
    let mut written = Vec::new();
    while let Some(field) =
        multipart.next_field().await.map_err(|error| E2bError::invalid(format!("malformed multipart body: {error}")))?
    {
        // A single file may be named by ?path=; otherwise each part's file name is its path.
        let wanted = match (&query.path, field.file_name()) {
            (Some(path), _) => path.clone(),
            (None, Some(name)) => name.to_owned(),
            (None, None) => return Err(E2bError::invalid("a multipart part has no file name")),
        };
        let data: Bytes = field.bytes().await.map_err(|_| too_large())?;
        if data.len() as u64 > max {
            return Err(too_large());
        }
        written.push(write_one(&state, &access, &wanted, data.to_vec()).await?);
    }
    if written.is_empty() {
        return Err(E2bError::invalid("the upload holds no file"));
    }
    Ok(Json(written))
}

/// A gzip upload's bytes, at most `max` of them once unpacked (more is refused, however well it compresses).
fn gunzip(compressed: &[u8], max: u64) -> Result<Vec<u8>, E2bError> {
    use std::io::Read as _;
    let mut data = Vec::new();
    let mut decoder = flate2::read::GzDecoder::new(compressed).take(max.saturating_add(1));
    decoder
        .read_to_end(&mut data)
        .map_err(|error| E2bError::invalid(format!("the upload is not valid gzip: {error}")))?;
    if data.len() as u64 > max {
        return Err(E2bError::new(Code::ResourceExhausted, format!("the upload unpacks to more than {max} bytes")));
    }
    Ok(data)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod gzip_tests {
    use std::io::Write as _;

    use super::*;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn a_gzip_upload_unpacks_within_the_bound_and_a_bomb_is_refused() {
        assert_eq!(gunzip(&gzip(b"hello"), 5).unwrap(), b"hello");
        let bomb = gzip(&vec![0u8; 10 << 20]);
        assert!(bomb.len() < 64 << 10, "it compresses well");
        let refused = gunzip(&bomb, 1 << 20).unwrap_err();
        assert!(refused.to_string().contains("more than 1048576 bytes"), "{refused}");
        assert!(gunzip(b"not gzip at all", 100).unwrap_err().to_string().contains("not valid gzip"));
    }
}
