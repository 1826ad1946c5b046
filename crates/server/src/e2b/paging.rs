//! E2B's paging of list answers (sandboxes and snapshots) over `crate::listing`'s keyset cursors: `limit` (1 to 100,
//! default 100: E2B's `paginationLimit`) and `nextToken` in the query, the next page's token in the `x-next-token`
//! response header (absent on the last page; the SDK's paginators stop there). Bad values are E2B's 400s.

use axum::Json;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::e2b::error::E2bError;
use crate::listing::{Cursor, CursorError, Order, Page};

/// E2B's page size bound and default.
const MAX_LIMIT: i64 = 100;

/// The page size `limit` asks for (none: 100).
pub(crate) fn limit(limit: Option<&str>) -> Result<usize, E2bError> {
    let Some(text) = limit else { return Ok(MAX_LIMIT as usize) };
    let problem = match text.parse::<i64>() {
        Ok(n) if n < 1 => "number must be at least 1".to_owned(),
        Ok(n) if n > MAX_LIMIT => format!("number must be at most {MAX_LIMIT}"),
        Ok(n) => return Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        Err(_) => format!("value {text:?} is not an integer"),
    };
    Err(E2bError::invalid(format!("parameter \"limit\" in query has an error: {problem}")))
}

/// Where the page `next_token` asks for starts, in a list in `order` (none or empty: the first page).
pub(crate) fn after(next_token: Option<&str>, order: Order) -> Result<Option<Cursor>, E2bError> {
    let Some(token) = next_token.filter(|token| !token.is_empty()) else { return Ok(None) };
    Cursor::parse(token, order).map(Some).map_err(|error| match error {
        CursorError::Malformed => E2bError::invalid("Invalid next token"),
        CursorError::OtherOrder => E2bError::invalid(format!("Invalid next token: {error}")),
    })
}

/// `page` as E2B's answer: the items as a JSON array, the next page's token in `x-next-token`.
pub(crate) fn answer<T: Serialize>(page: Page<T>) -> Response {
    let mut response = Json(page.items).into_response();
    if let Some(token) = page.next.and_then(|token| HeaderValue::from_str(&token).ok()) {
        response.headers_mut().insert("x-next-token", token);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_outside_e2b_s_bounds_are_refused_in_its_words() {
        assert_eq!(limit(None).ok(), Some(100));
        assert_eq!(limit(Some("1")).ok(), Some(1));
        for (bad, words) in [("0", "at least 1"), ("-3", "at least 1"), ("101", "at most 100"), ("ten", "integer")] {
            let error = limit(Some(bad)).err().map(|error| error.message).unwrap_or_default();
            assert!(error.contains(words), "{bad}: {error}");
        }
    }

    #[test]
    fn tokens_are_checked_for_the_order() {
        assert_eq!(after(None, Order::Desc).ok(), Some(None));
        assert_eq!(after(Some(""), Order::Desc).ok(), Some(None));
        let malformed = after(Some("1"), Order::Desc).err().map(|error| error.message);
        assert_eq!(malformed.as_deref(), Some("Invalid next token"));
    }
}
