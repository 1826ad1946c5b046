//! The Connect protocol as the E2B SDK speaks it (JSON codec, no compression): unary calls are a plain JSON body
//! answered with `application/json`; streams (either direction) are envelopes — one flags byte, a 4-byte big-endian
//! length, the JSON message — and a server stream ends with an envelope flagged `0x02` holding `{}` or
//! `{"error": {"code", "message"}}`. Deadlines come as `Connect-Timeout-Ms`.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::e2b::error::E2bError;

/// Flag of the envelope that ends a server stream.
pub(crate) const END_STREAM: u8 = 0x02;
/// Flag of a compressed envelope (refused: the SDK never compresses).
const COMPRESSED: u8 = 0x01;

/// One envelope: flags, length, payload.
pub(crate) fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(5 + payload.len());
    framed.push(flags);
    framed.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    framed.extend_from_slice(payload);
    framed
}

/// Splits a body into its envelopes (flags and payload each).
pub(crate) fn envelopes(mut body: &[u8]) -> Result<Vec<(u8, &[u8])>, E2bError> {
    let mut found = Vec::new();
    while !body.is_empty() {
        let (&flags, rest) = body.split_first().ok_or_else(|| E2bError::invalid("empty envelope"))?;
        let length = rest.get(..4).ok_or_else(|| E2bError::invalid("truncated envelope header"))?;
        let length = u32::from_be_bytes([length[0], length[1], length[2], length[3]]) as usize;
        let payload = rest.get(4..4 + length).ok_or_else(|| E2bError::invalid("truncated envelope"))?;
        if flags & COMPRESSED != 0 {
            return Err(E2bError::invalid("compressed messages are not supported"));
        }
        found.push((flags, payload));
        body = &rest[4 + length..];
    }
    Ok(found)
}

/// Decodes a JSON message; an empty body is the default message.
pub(crate) fn decode<T: DeserializeOwned + Default>(payload: &[u8]) -> Result<T, E2bError> {
    if payload.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(payload).map_err(|error| E2bError::invalid(format!("malformed request message: {error}")))
}

/// Decodes the single request message of a server-streaming call.
pub(crate) fn decode_stream_request<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, E2bError> {
    match envelopes(body)?.as_slice() {
        [(0, payload)] => decode(payload),
        _ => Err(E2bError::invalid("a server-streaming call takes exactly one request message")),
    }
}

/// The answer of a successful unary call.
pub(crate) fn unary<T: Serialize>(message: &T) -> Response {
    match serde_json::to_vec(message) {
        Ok(body) => ([(CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response(),
        Err(error) => E2bError::from(crate::api::error::ApiError::internal(error)).into_connect(),
    }
}

/// The deadline of a call (`Connect-Timeout-Ms`), if it has one.
pub(crate) fn timeout_ms(headers: &HeaderMap) -> Option<u64> {
    headers.get("connect-timeout-ms")?.to_str().ok()?.parse().ok().filter(|ms| *ms > 0)
}

/// The sending half of a server stream.
#[derive(Debug, Clone)]
pub(crate) struct StreamWriter {
    sender: mpsc::Sender<Result<Bytes, Infallible>>,
}

impl StreamWriter {
    /// Sends one message; false once the client has gone.
    pub(crate) async fn send<T: Serialize>(&self, message: &T) -> bool {
        let payload = serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec());
        self.sender.send(Ok(Bytes::from(envelope(0, &payload)))).await.is_ok()
    }

    /// Resolves once the client has gone (the answer's body was dropped), without waiting for a message to fail.
    pub(crate) async fn closed(&self) {
        self.sender.closed().await;
    }

    /// Ends the stream, with an error when given.
    pub(crate) async fn finish(self, error: Option<E2bError>) {
        let end = match error {
            Some(error) => serde_json::json!({ "error": error.connect_json() }),
            None => serde_json::json!({}),
        };
        let payload = serde_json::to_vec(&end).unwrap_or_else(|_| b"{}".to_vec());
        self.sender.send(Ok(Bytes::from(envelope(END_STREAM, &payload)))).await.ok();
    }
}

/// A streaming answer (`application/connect+json`, status 200) and the writer that feeds it.
pub(crate) fn stream() -> (StreamWriter, Response) {
    let (sender, receiver) = mpsc::channel(64);
    let body = Body::from_stream(ReceiverStream::new(receiver));
    let response =
        (StatusCode::OK, [(CONTENT_TYPE, HeaderValue::from_static("application/connect+json"))], body).into_response();
    (StreamWriter { sender }, response)
}

/// A stream that fails before its first message: an end message with the error.
pub(crate) fn failed_stream(error: E2bError) -> Response {
    let end = serde_json::json!({ "error": error.connect_json() });
    let payload = serde_json::to_vec(&end).unwrap_or_else(|_| b"{}".to_vec());
    (
        StatusCode::OK,
        [(CONTENT_TYPE, HeaderValue::from_static("application/connect+json"))],
        envelope(END_STREAM, &payload),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip() -> Result<(), E2bError> {
        let mut body = envelope(0, br#"{"a":1}"#);
        body.extend(envelope(END_STREAM, b"{}"));
        let found = envelopes(&body)?;
        assert_eq!(found, vec![(0, &br#"{"a":1}"#[..]), (END_STREAM, &b"{}"[..])]);
        assert_eq!(&body[..5], &[0, 0, 0, 0, 7]);
        Ok(())
    }

    #[test]
    fn truncated_and_compressed_envelopes_are_refused() {
        let body = envelope(0, b"{}");
        assert!(envelopes(&body[..4]).is_err());
        assert!(envelopes(&body[..6]).is_err());
        assert!(envelopes(&envelope(COMPRESSED, b"{}")).is_err());
    }

    #[test]
    fn a_stream_request_is_one_message() {
        #[derive(serde::Deserialize, Default)]
        struct Request {
            path: String,
        }
        let one = envelope(0, br#"{"path":"/x"}"#);
        assert_eq!(decode_stream_request::<Request>(&one).map(|r| r.path).ok().as_deref(), Some("/x"));
        let mut two = one.clone();
        two.extend(envelope(0, b"{}"));
        assert!(decode_stream_request::<Request>(&two).is_err());
    }

    #[test]
    fn timeout_header_is_read() {
        let mut headers = HeaderMap::new();
        assert_eq!(timeout_ms(&headers), None);
        headers.insert("connect-timeout-ms", HeaderValue::from_static("1500"));
        assert_eq!(timeout_ms(&headers), Some(1500));
    }
}
