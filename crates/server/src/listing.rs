//! Keyset paging of sandbox lists, shared by the native API (`GET /v1/sandboxes`) and the E2B facade
//! (`GET /v2/sandboxes`). Items are ordered by (start time, id); a page holds at most `limit` of them and the cursor of
//! the next page names the last one's (start time, id), so sandboxes that start or end between two requests never
//! shift a page (an offset would repeat or skip items then). The order is E2B's: `desc` is newest first with ties by id
//! ascending, `asc` its exact reverse (oldest first, ties by id descending).
//!
//! A cursor is E2B's token format, opaque to clients: base64url of `<RFC 3339 start time>__<id>`, with `__asc`
//! appended for ascending order. A cursor of one order is refused for the other (it would re-serve what was seen).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE;

use crate::clock::{parse_rfc3339_us, rfc3339};

/// Which way a list runs by start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Oldest first (ties: id descending).
    Asc,
    /// Newest first (ties: id ascending).
    Desc,
}

/// Where the next page starts: after the item with this start time and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The last item's start time, microseconds since the Unix epoch.
    started_us: i64,
    /// The last item's id.
    id: String,
}

/// A cursor that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CursorError {
    /// Not a token this server hands out.
    #[error("the cursor is malformed: pass back the token of the previous page as it is")]
    Malformed,
    /// A token of a list in the other order.
    #[error("the cursor was issued for the other sort order")]
    OtherOrder,
}

impl Cursor {
    /// Reads `token` for a list in `order`.
    pub fn parse(token: &str, order: Order) -> Result<Cursor, CursorError> {
        let decoded = URL_SAFE.decode(token).map_err(|_| CursorError::Malformed)?;
        let text = String::from_utf8(decoded).map_err(|_| CursorError::Malformed)?;
        let mut parts = text.split("__");
        let (Some(time), Some(id)) = (parts.next(), parts.next()) else { return Err(CursorError::Malformed) };
        let token_order = match parts.next() {
            None => Order::Desc,
            Some("asc") => Order::Asc,
            Some(_) => return Err(CursorError::Malformed),
        };
        if parts.next().is_some() || id.is_empty() {
            return Err(CursorError::Malformed);
        }
        let started_us = parse_rfc3339_us(time).ok_or(CursorError::Malformed)?;
        if token_order != order {
            return Err(CursorError::OtherOrder);
        }
        Ok(Cursor { started_us, id: id.to_owned() })
    }

    /// The token of a cursor after the item `(started_ms, id)` of a list in `order`.
    fn token(started_ms: i64, id: &str, order: Order) -> String {
        let suffix = if order == Order::Asc { "__asc" } else { "" };
        URL_SAFE.encode(format!("{}__{id}{suffix}", rfc3339(started_ms)))
    }
}

/// One page of a list, and the cursor of the next when more follow.
#[derive(Debug)]
pub struct Page<T> {
    /// The items, in order.
    pub items: Vec<T>,
    /// The token of the next page (`None` on the last).
    pub next: Option<String>,
}

/// The page of `items` (in any order; `key` gives each one's start time in ms and id) that follows `after` in
/// `order`, at most `limit` long.
pub fn page<T>(
    mut items: Vec<T>,
    key: impl Fn(&T) -> (i64, &str),
    order: Order,
    limit: usize,
    after: Option<&Cursor>,
) -> Page<T> {
    let sort_key = |item: &T| {
        let (started_ms, id) = key(item);
        (started_ms.saturating_mul(1000), id.to_owned())
    };
    items.sort_by(|a, b| {
        let ((a_time, a_id), (b_time, b_id)) = (sort_key(a), sort_key(b));
        match order {
            Order::Desc => b_time.cmp(&a_time).then(a_id.cmp(&b_id)),
            Order::Asc => a_time.cmp(&b_time).then(b_id.cmp(&a_id)),
        }
    });
    if let Some(cursor) = after {
        items.retain(|item| {
            let (time, id) = sort_key(item);
            match order {
                Order::Desc => time < cursor.started_us || (time == cursor.started_us && id > cursor.id),
                Order::Asc => time > cursor.started_us || (time == cursor.started_us && id < cursor.id),
            }
        });
    }
    let more = items.len() > limit;
    items.truncate(limit);
    let next = match items.last() {
        Some(last) if more => {
            let (started_ms, id) = key(last);
            Some(Cursor::token(started_ms, id, order))
        }
        _ => None,
    };
    Page { items, next }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn ids(page: &Page<(i64, &'static str)>) -> Vec<&'static str> {
        page.items.iter().map(|(_, id)| *id).collect()
    }

    fn walk(items: &[(i64, &'static str)], order: Order, limit: usize) -> Vec<Vec<&'static str>> {
        let mut pages = Vec::new();
        let mut cursor = None;
        loop {
            let page = page(items.to_vec(), |(t, id)| (*t, *id), order, limit, cursor.as_ref());
            pages.push(ids(&page));
            let Some(token) = page.next else { return pages };
            cursor = Some(Cursor::parse(&token, order).unwrap());
        }
    }

    const ITEMS: [(i64, &str); 5] = [(3, "sb-c"), (1, "sb-a"), (2, "sb-x"), (2, "sb-b"), (4, "sb-d")];

    #[test]
    fn descending_is_newest_first_ties_by_id_and_ascending_its_reverse() {
        assert_eq!(walk(&ITEMS, Order::Desc, 2), [vec!["sb-d", "sb-c"], vec!["sb-b", "sb-x"], vec!["sb-a"]]);
        assert_eq!(walk(&ITEMS, Order::Asc, 2), [vec!["sb-a", "sb-x"], vec!["sb-b", "sb-c"], vec!["sb-d"]]);
        assert_eq!(walk(&ITEMS, Order::Desc, 5), [vec!["sb-d", "sb-c", "sb-b", "sb-x", "sb-a"]]);
        assert_eq!(walk(&[], Order::Desc, 5), [Vec::<&str>::new()]);
    }

    #[test]
    fn a_page_does_not_shift_when_items_come_and_go_between_requests() {
        let first = page(ITEMS.to_vec(), |(t, id)| (*t, *id), Order::Desc, 2, None);
        assert_eq!(ids(&first), ["sb-d", "sb-c"]);
        let cursor = Cursor::parse(&first.next.unwrap(), Order::Desc).unwrap();
        // Since: a newer sandbox started, one already listed ended and one of the next page ended.
        let now: Vec<_> = [(9, "sb-new"), (3, "sb-c"), (1, "sb-a"), (2, "sb-x")].to_vec();
        let second = page(now, |(t, id)| (*t, *id), Order::Desc, 2, Some(&cursor));
        assert_eq!(ids(&second), ["sb-x", "sb-a"], "an offset would have skipped sb-x");
        assert_eq!(second.next, None);
    }

    #[test]
    fn tokens_are_e2b_s_format_and_bad_ones_are_named() {
        let token = Cursor::token(1_714_564_800_250, "sb-1", Order::Asc);
        assert_eq!(URL_SAFE.decode(&token).unwrap(), b"2024-05-01T12:00:00.250Z__sb-1__asc");
        assert_eq!(Cursor::parse(&token, Order::Asc).unwrap().started_us, 1_714_564_800_250_000);
        assert_eq!(Cursor::parse(&token, Order::Desc), Err(CursorError::OtherOrder));
        let desc = Cursor::token(0, "sb-1", Order::Desc);
        assert_eq!(URL_SAFE.decode(&desc).unwrap(), b"1970-01-01T00:00:00.000Z__sb-1");
        let encode = |text: &str| URL_SAFE.encode(text);
        for bad in [
            "garbage!".to_owned(),
            "1".to_owned(),
            encode("no separator"),
            encode("2024-05-01T12:00:00Z__"),
            encode("yesterday__sb-1"),
            encode("2024-05-01T12:00:00Z__sb-1__sideways"),
            encode("2024-05-01T12:00:00Z__sb-1__asc__more"),
            URL_SAFE.encode([0xff, 0xfe]),
        ] {
            assert_eq!(Cursor::parse(&bad, Order::Desc), Err(CursorError::Malformed), "{bad}");
        }
    }
}
