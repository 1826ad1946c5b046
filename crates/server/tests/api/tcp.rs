//! The real server over TCP (`serve_on`): SSE output crosses the socket before the command ends, the database file
//! is created and reconciled at start, and shutdown is graceful.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandkasten_server::serve_on;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::fake::FakeRuntime;
use crate::harness::{KEY_A, test_config};

/// Sends one HTTP/1.1 request (connection closed after it) and returns the stream to read the answer from.
pub(crate) async fn request(port: u16, method: &str, path: &str, body: &str, accept: &str) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY_A}\r\nAccept: {accept}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

pub(crate) async fn read_all(mut stream: TcpStream) -> String {
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text
}

#[tokio::test]
async fn sse_output_crosses_the_socket_before_the_command_ends() {
    let dir = tempfile::tempdir().unwrap();
    let config = sandkasten_server::ServerConfig { database: dir.path().join("db/sandkasten.db"), ..test_config() };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_on(listener, config, Arc::new(FakeRuntime::default()), async {
        stopped.await.ok();
    }));

    let created = read_all(request(port, "POST", "/v1/sandboxes", "{}", "application/json").await).await;
    assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    let id = created.split("\"id\":\"").nth(1).unwrap().split('"').next().unwrap().to_owned();

    let body = r#"{"argv": ["steps", "out:early", "sleep:800", "out:late"]}"#;
    let started = Instant::now();
    let mut stream = request(port, "POST", &format!("/v1/sandboxes/{id}/exec"), body, "text/event-stream").await;
    let mut seen = String::new();
    let mut buffer = [0u8; 4096];
    while !seen.contains("early") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer)).await.unwrap().unwrap();
        assert!(n > 0, "connection closed before any output: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buffer[..n]));
    }
    assert!(started.elapsed() < Duration::from_millis(600), "output was held back for {:?}", started.elapsed());
    assert!(!seen.contains("event: exit"));
    let rest = read_all(stream).await;
    assert!(rest.contains("late") && rest.contains("event: exit"), "{rest}");
    assert!(started.elapsed() >= Duration::from_millis(800));

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap().unwrap();
    assert!(dir.path().join("db/sandkasten.db").exists());
}

#[tokio::test]
async fn restart_marks_sandboxes_of_a_dead_runtime_lost() {
    let dir = tempfile::tempdir().unwrap();
    let config = sandkasten_server::ServerConfig { database: dir.path().join("sandkasten.db"), ..test_config() };
    let start = |config| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // A new runtime each time: the old sandboxes' processes are gone, as after a daemon crash.
        let server = tokio::spawn(serve_on(listener, config, Arc::new(FakeRuntime::default()), async {
            stopped.await.ok();
        }));
        (port, stop, server)
    };
    let (port, stop, server) = start(config.clone()).await;
    let created = read_all(request(port, "POST", "/v1/sandboxes", "{}", "application/json").await).await;
    let id = created.split("\"id\":\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();

    let (port, stop, server) = start(config).await;
    let record = read_all(request(port, "GET", &format!("/v1/sandboxes/{id}"), "", "application/json").await).await;
    assert!(record.contains("\"state\":\"lost\""), "{record}");
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
