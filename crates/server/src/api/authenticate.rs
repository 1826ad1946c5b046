//! The middleware on every `/v1` route: the request's `Authorization` header must name a tenant's key (the keyring,
//! `auth`, decides); the tenant goes into the request's extensions, and its name into the response's for the log.
//! Handlers take the tenant as an extractor.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::error::ApiError;
use crate::api::request_log::LoggedTenant;
use crate::auth::Tenant;
use crate::state::AppState;

/// Middleware on every `/v1` route: authenticates the request and stores its `Tenant` in the extensions.
pub(crate) async fn require_tenant(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    match state.keyring().authenticate(request.headers().get(AUTHORIZATION)) {
        Ok(tenant) => {
            let name = LoggedTenant(Arc::clone(&tenant.name));
            request.extensions_mut().insert(tenant);
            let mut response = next.run(request).await;
            response.extensions_mut().insert(name);
            response
        }
        Err(error) => {
            tracing::debug!(path = %request.uri().path(), reason = %error, "request refused");
            let mut response = ApiError::unauthorized(error.to_string()).into_response();
            response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            debug_assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
            response
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Tenant>().cloned().ok_or_else(|| ApiError::unauthorized("missing API key"))
    }
}
