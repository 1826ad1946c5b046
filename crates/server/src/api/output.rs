//! Output of one command as the API hands it out: kept up to the sandbox's output limit per stream (and, when
//! collected for a JSON answer, charged to the sandbox's output budget while it is held), and, for
//! streams, cut into events (`OutputEvent`) that never split a UTF-8 character (a partial character waits for the
//! next chunk); and the two helpers of every event-stream answer (`wants_stream`, `json_event`).

use sandkasten_runtime::Held;
use sandkasten_types::OutputStream;
use serde::Serialize;
use utoipa::ToSchema;

/// Data of a `stdout` or `stderr` event of an exec stream.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutputEvent {
    /// The chunk as text (a character split across chunks is sent whole with the next chunk); empty when the chunk
    /// is binary (not UTF-8, a NUL, many control characters): then `base64` has it.
    pub data: String,
    /// The exact bytes in base64, only when they are binary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

/// One stream's output so far.
#[derive(Debug, Default)]
pub(crate) struct Capture {
    /// The budget kept bytes are charged to (collecting mode; `None`: not charged).
    held: Option<Held>,
    /// Bytes kept (only when collecting; streaming forwards instead of keeping).
    kept: Vec<u8>,
    /// Bytes accepted so far (kept or forwarded), at most the limit.
    accepted: u64,
    /// True once output went past the limit.
    truncated: bool,
    /// The tail of the last forwarded chunk that is an incomplete UTF-8 character.
    carry: Vec<u8>,
}

impl Capture {
    /// A capture that collects, charging what it keeps to `held`'s budget.
    pub(crate) fn charged(held: Held) -> Capture {
        Capture { held: Some(held), ..Capture::default() }
    }

    /// The part of `data` that still fits under `limit` (and the budget); the rest is dropped and marks the stream
    /// truncated.
    fn fit<'a>(&mut self, data: &'a [u8], limit: u64) -> &'a [u8] {
        if self.truncated {
            // Once a chunk was refused, later ones are too: the output kept is a prefix, never one with holes.
            return &[];
        }
        let room = limit.saturating_sub(self.accepted);
        let fits = data.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let take = match &mut self.held {
            Some(held) => usize::try_from(held.take(fits as u64)).unwrap_or(fits),
            None => fits,
        };
        if take < data.len() {
            self.truncated = true;
        }
        self.accepted += take as u64;
        &data[..take]
    }

    /// Keeps what fits of `data` (collecting mode).
    pub(crate) fn keep(&mut self, data: &[u8], limit: u64) {
        let fitting = self.fit(data, limit);
        self.kept.extend_from_slice(fitting);
    }

    /// What fits of `data` as an event, holding back an incomplete trailing character (streaming mode).
    pub(crate) fn forward(&mut self, data: &[u8], limit: u64) -> Option<OutputEvent> {
        let fitting = self.fit(data, limit);
        let mut pending = std::mem::take(&mut self.carry);
        pending.extend_from_slice(fitting);
        let complete = pending.len() - sandkasten_types::utf8::incomplete_tail_len(&pending);
        self.carry = pending.split_off(complete);
        event(&pending)
    }

    /// Whatever is held back, at the end of the stream.
    pub(crate) fn flush(&mut self) -> Option<OutputEvent> {
        let rest = std::mem::take(&mut self.carry);
        event(&rest)
    }

    /// True once output went past the limit.
    pub(crate) fn truncated(&self) -> bool {
        self.truncated
    }

    /// The kept bytes in the shape of `ExecResult`'s streams.
    /// A cut stream ends on a whole character: the bytes of one the limit cut through are dropped too.
    pub(crate) fn into_stream(mut self) -> OutputStream {
        let mut bytes = std::mem::take(&mut self.kept);
        if self.truncated {
            bytes.truncate(sandkasten_types::utf8::whole_characters(&bytes).len());
        }
        OutputStream { bytes, truncated: self.truncated }
    }
}

/// `bytes` as an event (text, or base64 when they are binary); `None` when empty.
pub(crate) fn event(bytes: &[u8]) -> Option<OutputEvent> {
    if bytes.is_empty() {
        return None;
    }
    let (data, base64) = sandkasten_types::json_forms(bytes);
    Some(OutputEvent { data, base64 })
}

/// Whether the client asked for a stream of server-sent events (`Accept: text/event-stream`).
pub(crate) fn wants_stream(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.contains("text/event-stream"))
}

/// A server-sent event `name` whose data is `data` as JSON.
pub(crate) fn json_event<T: serde::Serialize>(name: &'static str, data: &T) -> axum::response::sse::Event {
    use axum::response::sse::Event;
    Event::default().event(name).json_data(data).unwrap_or_else(|_| Event::default().event(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_output_stops_at_the_limit() {
        let mut capture = Capture::default();
        capture.keep(b"hello ", 8);
        capture.keep(b"world", 8);
        let stream = capture.into_stream();
        assert_eq!(stream.bytes, b"hello wo");
        assert!(stream.truncated);
    }

    #[test]
    fn kept_output_stops_at_the_budget_and_credits_it_back() {
        let budget = sandkasten_runtime::OutputBudget::new(4, None);
        let mut capture = Capture::charged(Held::new(std::sync::Arc::clone(&budget)));
        capture.keep(b"hello", 8);
        assert_eq!(budget.used(), 4);
        let stream = capture.into_stream();
        assert_eq!((stream.bytes.as_slice(), stream.truncated), (&b"hell"[..], true));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_character_split_across_chunks_is_sent_whole() {
        let euro = "€".as_bytes();
        let mut capture = Capture::default();
        let first = capture.forward(&[b'a', euro[0], euro[1]], 100).map(|e| e.data);
        assert_eq!(first.as_deref(), Some("a"));
        let second = capture.forward(&[euro[2], b'b'], 100);
        assert_eq!(second.as_ref().map(|e| e.data.as_str()), Some("€b"));
        assert_eq!(second.and_then(|e| e.base64), None);
        assert!(capture.flush().is_none());
    }

    #[test]
    fn invalid_bytes_travel_in_base64_and_a_dangling_lead_byte_is_flushed() {
        let mut capture = Capture::default();
        let event = capture.forward(&[0xff, b'x'], 100);
        assert_eq!(event.and_then(|e| e.base64).as_deref(), Some("/3g="));
        assert!(capture.forward(&[0xE2], 100).is_none());
        assert_eq!(capture.flush().and_then(|e| e.base64).as_deref(), Some("4g=="));
    }
}
