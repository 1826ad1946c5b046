//! The client's HTTP side (ureq, blocking): the server's URL and API key, JSON, raw bytes and event streams, and the
//! one error type every command reports: the server's `{"error": {code, message}}`, or why it could not be reached,
//! with the exit code it maps to (2 for input errors, 125 for server failures and an unreachable server).

use std::io::BufRead;
use std::time::Duration;

use serde_json::Value;
use ureq::http::Response;
use ureq::{Agent, Body, RequestBuilder};

use crate::exit_codes;

/// Largest response body read (files, results).
const MAX_BODY_BYTES: u64 = 1 << 30;

/// A failed call, ready to print as `sandkasten: <message>` and exit with `exit_code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientError {
    /// The exit code for it.
    pub exit_code: i32,
    /// One line for the user.
    pub message: String,
}

impl ClientError {
    /// An input error (exit 2).
    pub fn input(message: impl Into<String>) -> Self {
        ClientError { exit_code: exit_codes::BAD_INPUT, message: message.into() }
    }

    /// A failure of the server or the connection (exit 125).
    pub fn server(message: impl Into<String>) -> Self {
        ClientError { exit_code: exit_codes::SANDBOX_ERROR, message: message.into() }
    }
}

/// The error for an answer with status `status` and body `body`.
pub fn from_status(status: u16, body: &[u8]) -> ClientError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let message =
        parsed.as_ref().and_then(|json| json["error"]["message"].as_str()).map(str::to_owned).unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body);
            format!("the server answered {status}: {}", text.trim())
        });
    match status {
        401 => ClientError::input(format!("{message} (set SANDKASTEN_API_KEY to an API key the server knows)")),
        400..=499 => ClientError::input(message),
        _ => ClientError::server(message),
    }
}

/// A sandkasten server.
#[derive(Clone)]
pub struct Client {
    base: String,
    key: Option<String>,
    agent: Agent,
}

impl Client {
    /// A client for the server at `url` (http://host:port), authenticating with `key` when given.
    pub fn new(url: &str, key: Option<String>) -> Result<Client, ClientError> {
        let base = url.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") {
            return Err(ClientError::input(format!(
                "--url {url:?} is not supported: give http://HOST:PORT (this build speaks plain HTTP; put TLS in a \
                 reverse proxy)"
            )));
        }
        let config =
            Agent::config_builder().http_status_as_error(false).timeout_connect(Some(Duration::from_secs(10))).build();
        Ok(Client { base, key: key.filter(|k| !k.is_empty()), agent: config.into() })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn authed<B>(&self, builder: RequestBuilder<B>) -> RequestBuilder<B> {
        match &self.key {
            Some(key) => builder.header("Authorization", format!("Bearer {key}")),
            None => builder,
        }
    }

    /// Maps transport errors and error statuses; returns a successful response.
    fn check(&self, result: Result<Response<Body>, ureq::Error>) -> Result<Response<Body>, ClientError> {
        let mut response = result.map_err(|error| self.transport(error))?;
        let status = response.status().as_u16();
        if status < 400 {
            return Ok(response);
        }
        let body = response.body_mut().with_config().limit(1 << 20).read_to_vec().unwrap_or_default();
        Err(from_status(status, &body))
    }

    fn transport(&self, error: ureq::Error) -> ClientError {
        match error {
            ureq::Error::BadUri(detail) => ClientError::input(format!("--url {}: {detail}", self.base)),
            other => ClientError::server(format!(
                "cannot reach the sandkasten server at {} ({other}); is `sandkasten serve` running? Set the URL \
                 with --url or SANDKASTEN_URL",
                self.base
            )),
        }
    }

    fn read_json(&self, mut response: Response<Body>) -> Result<Value, ClientError> {
        response
            .body_mut()
            .with_config()
            .limit(MAX_BODY_BYTES)
            .read_json()
            .map_err(|error| ClientError::server(format!("the server's answer is not JSON: {error}")))
    }

    /// `GET path?query` → JSON.
    pub fn get_json(&self, path: &str, query: &[(String, String)]) -> Result<Value, ClientError> {
        let request = self.authed(self.agent.get(self.url(path))).query_pairs(query.iter().map(|(k, v)| (k, v)));
        let response = self.check(request.call())?;
        self.read_json(response)
    }

    /// `POST path` with a JSON body → JSON (or `null` for an empty answer).
    pub fn post_json(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let response = self.check(self.authed(self.agent.post(self.url(path))).send_json(body))?;
        if response.status().as_u16() == 204 {
            return Ok(Value::Null);
        }
        self.read_json(response)
    }

    /// `POST path` with a JSON body, asking for an event stream; the answer's body as lines.
    pub fn post_stream(&self, path: &str, body: &Value) -> Result<impl BufRead + use<>, ClientError> {
        let request = self.authed(self.agent.post(self.url(path))).header("Accept", "text/event-stream");
        let response = self.check(request.send_json(body))?;
        Ok(std::io::BufReader::new(response.into_body().into_reader()))
    }

    /// `GET path` of an event stream; the answer's body as lines.
    pub fn get_stream(&self, path: &str) -> Result<impl BufRead + use<>, ClientError> {
        let request = self.authed(self.agent.get(self.url(path))).header("Accept", "text/event-stream");
        let response = self.check(request.call())?;
        Ok(std::io::BufReader::new(response.into_body().into_reader()))
    }

    /// `PUT path` with a JSON body → JSON.
    pub fn put_json(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let response = self.check(self.authed(self.agent.put(self.url(path))).send_json(body))?;
        self.read_json(response)
    }

    /// `DELETE path`.
    pub fn delete(&self, path: &str) -> Result<(), ClientError> {
        self.check(self.authed(self.agent.delete(self.url(path))).call()).map(drop)
    }

    /// `GET path?query` → raw bytes.
    pub fn get_bytes(&self, path: &str, query: &[(String, String)]) -> Result<Vec<u8>, ClientError> {
        let request = self.authed(self.agent.get(self.url(path))).query_pairs(query.iter().map(|(k, v)| (k, v)));
        let mut response = self.check(request.call())?;
        response
            .body_mut()
            .with_config()
            .limit(MAX_BODY_BYTES)
            .read_to_vec()
            .map_err(|error| ClientError::server(format!("reading the server's answer failed: {error}")))
    }

    /// `PUT path?query` with raw bytes.
    pub fn put_bytes(&self, path: &str, query: &[(String, String)], data: &[u8]) -> Result<(), ClientError> {
        let request = self
            .authed(self.agent.put(self.url(path)))
            .query_pairs(query.iter().map(|(k, v)| (k, v)))
            .header("Content-Type", "application/octet-stream");
        self.check(request.send(data)).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_exit_codes_and_the_servers_message() {
        let body = br#"{"error":{"code":"not_found","message":"sandbox sb-1 not found"}}"#;
        assert_eq!(from_status(404, body), ClientError::input("sandbox sb-1 not found"));
        for status in [400, 409, 413, 422, 429] {
            assert_eq!(from_status(status, body).exit_code, exit_codes::BAD_INPUT);
        }
        let auth = from_status(401, br#"{"error":{"code":"unauthorized","message":"missing key"}}"#);
        assert!(auth.message.contains("SANDKASTEN_API_KEY") && auth.exit_code == exit_codes::BAD_INPUT);
        let internal = from_status(502, b"bad gateway");
        assert_eq!(internal.exit_code, exit_codes::SANDBOX_ERROR);
        assert!(internal.message.contains("502") && internal.message.contains("bad gateway"));
    }

    #[test]
    fn only_plain_http_urls_are_accepted() {
        assert!(Client::new("http://127.0.0.1:8080/", None).is_ok());
        assert_eq!(Client::new("https://x", None).err().map(|e| e.exit_code), Some(exit_codes::BAD_INPUT));
        assert!(Client::new("localhost:8080", None).is_err());
    }

    #[test]
    fn an_unreachable_server_is_exit_125_with_the_url() {
        // Port 9 on loopback (discard) is closed on any sane test host.
        let client = Client::new("http://127.0.0.1:9", None).map_err(|e| e.message);
        let error = client.and_then(|c| c.get_json("/healthz", &[]).map_err(|e| e.message));
        let message = error.err().unwrap_or_default();
        assert!(message.contains("http://127.0.0.1:9") && message.contains("running"), "{message}");
    }
}
