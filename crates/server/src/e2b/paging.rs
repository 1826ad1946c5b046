//! E2B's paging of list answers: `limit` and `nextToken` in the query, the next page's token in the `x-next-token`
//! response header (absent on the last page; the SDK's paginators stop there). The token is the offset of the next
//! page's first item in the full, ordered list.

use axum::Json;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::e2b::error::E2bError;

/// The page of `items` that `limit` (none or 0: all) and `next_token` ask for, as a JSON array answer with the
/// `x-next-token` header when more follow.
pub(crate) fn page<T: Serialize>(
    items: Vec<T>,
    limit: Option<usize>,
    next_token: Option<&str>,
) -> Result<Response, E2bError> {
    let start = match next_token {
        Some(token) => token.parse::<usize>().map_err(|_| E2bError::invalid("malformed nextToken"))?,
        None => 0,
    };
    let total = items.len();
    let limit = limit.filter(|limit| *limit > 0).unwrap_or(usize::MAX);
    let end = start.saturating_add(limit).min(total);
    let page: Vec<T> = items.into_iter().skip(start).take(end.saturating_sub(start)).collect();
    let mut response = Json(page).into_response();
    if end < total
        && let Ok(value) = HeaderValue::from_str(&end.to_string())
    {
        response.headers_mut().insert("x-next-token", value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(response: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap_or_default();
        serde_json::from_slice(&bytes).unwrap_or_default()
    }

    #[tokio::test]
    async fn pages_follow_the_token_until_the_last() -> Result<(), E2bError> {
        let first = page(vec![1, 2, 3], Some(2), None)?;
        assert_eq!(first.headers().get("x-next-token").map(|v| v.as_bytes()), Some(&b"2"[..]));
        assert_eq!(body(first).await, serde_json::json!([1, 2]));
        let last = page(vec![1, 2, 3], Some(2), Some("2"))?;
        assert!(last.headers().get("x-next-token").is_none());
        assert_eq!(body(last).await, serde_json::json!([3]));
        let beyond = page(vec![1, 2, 3], None, Some("9"))?;
        assert_eq!(body(beyond).await, serde_json::json!([]));
        assert!(page(vec![1], None, Some("x")).is_err());
        Ok(())
    }
}
