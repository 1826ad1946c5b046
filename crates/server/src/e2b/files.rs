//! envd's HTTP routes: `GET /files?path=` downloads a file, `POST /files` uploads one or more (multipart, each part
//! named by its file name, or a raw `application/octet-stream` body with `?path=`), creating missing parent
//! directories as envd does; `GET /health` answers 204 while the sandbox runs and 502 otherwise. Errors are envd's
//! `{"code", "message"}` with the status the SDK maps (404 is `FileNotFoundException`); `/health` of a sandbox
//! that is gone is the proxy's 502 with its "was not found" body. Both take the access token
//! or a signed URL's signature (`signing`).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE, VARY};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sandkasten_types::{CommandUser, FailureKind, FileMetadata, check_metadata};
use serde::{Deserialize, Serialize};

use crate::e2b::auth::{SandboxAccess, request_user, runtime_failure, sandbox_access, sandbox_user};
use crate::e2b::error::{Code, E2bError};
use crate::e2b::paths;
use crate::e2b::signing::{Operation, Signed, file_access};
use crate::state::AppState;

/// The query of `/files`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<i64>,
    sandbox_id: Option<String>,
}

impl FilesQuery {
    fn signed(&self) -> Signed<'_> {
        Signed {
            path: self.path.as_deref().unwrap_or_default(),
            user: self.username.as_deref().unwrap_or_default(),
            signature: self.signature.as_deref(),
            expiration: self.signature_expiration,
            sandbox: self.sandbox_id.as_deref(),
        }
    }
}

/// One written file, as envd answers it (`metadata`: what the file holds after the upload, left out when none).
#[derive(Debug, Serialize)]
pub(crate) struct WriteInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    #[serde(skip_serializing_if = "FileMetadata::is_empty")]
    metadata: FileMetadata,
}

/// The prefix of the upload headers that carry file metadata (`X-Metadata-<key>: <value>`).
const METADATA_HEADER_PREFIX: &str = "x-metadata-";

/// Who the request acts as: `?username=`, else the `Authorization` user. A request let in by a signed URL acts only
/// as the user the signature covers (`?username=`, else the default user): an `Authorization` header added to a URL
/// signed for `user` must not make it root's.
fn user_of(query: &FilesQuery, headers: &HeaderMap) -> Result<CommandUser, E2bError> {
    let by_signature = !headers.contains_key("x-access-token");
    match &query.username {
        Some(user) => sandbox_user(user),
        None if by_signature => sandbox_user("user"),
        None => sandbox_user(&request_user(headers)?),
    }
}

/// The metadata an upload sets, from its `X-Metadata-*` headers as envd reads them: keys lowercased (header names
/// are), the first value of a repeated header, an empty key ignored; checked as envd checks it (400 naming what is
/// wrong).
fn upload_metadata(headers: &HeaderMap) -> Result<FileMetadata, E2bError> {
    let mut metadata = FileMetadata::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER_PREFIX) else { continue };
        if key.is_empty() || metadata.contains_key(key) {
            continue;
        }
        let value = std::str::from_utf8(value.as_bytes()).map_err(|_| {
            E2bError::invalid(format!("invalid metadata: metadata value for key {key:?} is not printable US-ASCII"))
        })?;
        metadata.insert(key.to_owned(), value.to_owned());
    }
    check_metadata(&metadata).map_err(|message| E2bError::invalid(format!("invalid metadata: {message}")))?;
    Ok(metadata)
}

/// `GET /health`.
pub(crate) async fn health(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match sandbox_access(&state, &headers).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        // A sandbox that is gone: E2B's proxy answers for it, 502 with "was not found" in its body, which the SDK's
        // health probe reads (a command cut off by a kill then raises "killed or reached its end of life").
        Err(error) if error.code == Code::Unavailable => error.into_response(),
        // Otherwise the status alone, as envd answers; counted like every other error.
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
    let Query(query) = query.map_err(|rejection| E2bError::invalid(rejection.body_text()))?;
    let access = file_access(&state, &headers, query.signed(), Operation::Read).await?;
    let user = user_of(&query, &headers)?;
    let wanted = query.path.as_deref().ok_or_else(|| E2bError::invalid("give the file as ?path="))?;
    let path = paths::to_sandbox(wanted)?;
    let max = state.settings().max_file_bytes;
    let gzip = accepts_gzip(&headers);
    match state.runtime().read_file_as(&access.id, &path, max, user).await {
        Ok(data) if gzip => {
            // Compressing is CPU work proportional to the file (up to `max_file_bytes`): off the async workers.
            let compressed = tokio::task::spawn_blocking(move || compress(&data))
                .await
                .map_err(|error| E2bError::new(Code::Internal, format!("compressing the download: {error}")))?
                .map_err(|error| E2bError::new(Code::Internal, format!("compressing the download: {error}")))?;
            let headers = [
                (CONTENT_TYPE, HeaderValue::from_static("application/octet-stream")),
                (CONTENT_ENCODING, HeaderValue::from_static("gzip")),
                (VARY, HeaderValue::from_static("accept-encoding")),
            ];
            Ok((headers, compressed).into_response())
        }
        Ok(data) => Ok(([(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"))], data).into_response()),
        Err(failure) if failure.kind == FailureKind::NotFound => {
            Err(E2bError::new(Code::NotFound, format!("path '{wanted}' does not exist")))
        }
        Err(failure) => Err(runtime_failure(&state, &access.id, failure).await),
    }
}

/// How a file of an upload is written: as whom, with what metadata.
#[derive(Debug, Clone)]
struct Writing {
    user: CommandUser,
    /// Replaces the file's metadata (an overwrite without any clears it, as in envd).
    metadata: FileMetadata,
}

async fn write_one(
    state: &AppState,
    access: &SandboxAccess,
    wanted: &str,
    data: Vec<u8>,
    writing: &Writing,
) -> Result<WriteInfo, E2bError> {
    let path = paths::to_sandbox(wanted)?;
    let user = writing.user;
    if let Some((parent, _)) = path.rsplit_once('/')
        && !parent.is_empty()
        && let Err(failure) = state.runtime().mkdir_as(&access.id, parent, true, user).await
        && failure.kind != FailureKind::AlreadyExists
    {
        return Err(runtime_failure(state, &access.id, failure).await);
    }
    if let Err(failure) = state.runtime().write_file_as(&access.id, &path, data, user).await {
        return Err(runtime_failure(state, &access.id, failure).await);
    }
    let metadata = writing.metadata.clone();
    if let Err(failure) = state.runtime().set_metadata(&access.id, &path, metadata.clone(), user).await {
        // A filesystem without user attributes cannot hold metadata, so only asking for some is an error.
        if !(metadata.is_empty() && failure.kind == FailureKind::InvalidPath) {
            return Err(runtime_failure(state, &access.id, failure).await);
        }
    }
    let name = path.rsplit('/').next().unwrap_or_default().to_owned();
    Ok(WriteInfo { name, kind: "file", path: path.clone(), metadata })
}

/// `POST /files`: write one file (octet-stream with `?path=`) or several (multipart).
pub(crate) async fn upload(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<FilesQuery>, QueryRejection>,
    request: Request,
) -> Result<Json<Vec<WriteInfo>>, E2bError> {
    let Query(query) = query.map_err(|rejection| E2bError::invalid(rejection.body_text()))?;
    let access = file_access(&state, &headers, query.signed(), Operation::Write).await?;
    let user = user_of(&query, &headers)?;
    let metadata = match upload_metadata(&headers) {
        Ok(metadata) => metadata,
        Err(error) => {
            // Read the body first (bounded) so the client's connection stays usable for its next request.
            let limit = usize::try_from(state.settings().max_file_bytes).unwrap_or(usize::MAX);
            let _ = axum::body::to_bytes(request.into_body(), limit).await;
            return Err(error);
        }
    };
    let writing = Writing { user, metadata };
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
        return Ok(Json(vec![write_one(&state, &access, &wanted, data, &writing).await?]));
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
        written.push(write_one(&state, &access, &wanted, data.to_vec(), &writing).await?);
    }
    if written.is_empty() {
        return Err(E2bError::invalid("the upload holds no file"));
    }
    Ok(Json(written))
}

/// Whether the client takes a gzip-compressed answer (`Accept-Encoding: gzip`, as the SDK's `files.read(gzip=True)`
/// sends it; `gzip;q=0` refuses it).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers.get_all(ACCEPT_ENCODING).iter().filter_map(|value| value.to_str().ok()).flat_map(|v| v.split(',')).any(
        |coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let refused = parts.any(|p| p.strip_prefix("q=").is_some_and(|q| q.parse::<f32>().is_ok_and(|q| q == 0.0)));
            name.eq_ignore_ascii_case("gzip") && !refused
        },
    )
}

/// `data` gzip-compressed.
fn compress(data: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data)?;
    encoder.finish()
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
    fn a_download_is_compressed_only_for_a_client_that_takes_gzip() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(ACCEPT_ENCODING, HeaderValue::from_str(value).unwrap());
            accepts_gzip(&headers)
        };
        assert!(with("gzip") && with("deflate, GZIP;q=0.5") && with("br, gzip"));
        assert!(!with("identity") && !with("gzip;q=0") && !with("gzipped") && !accepts_gzip(&HeaderMap::new()));
        let text = b"compressible line\n".repeat(1000);
        let packed = compress(&text).unwrap();
        assert!(packed.len() < text.len() / 10);
        assert_eq!(gunzip(&packed, text.len() as u64).unwrap(), text);
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
