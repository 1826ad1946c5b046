//! Secrets at rest, attacked through the real server (`serve_on` over TCP on a database file): a value put through the
//! API is in none of the database's files (the database, its WAL, its shared-memory file; as is, in hex or in base64)
//! while the server runs or after; a copy of the database started without its key is refused, naming what it needs,
//! and loses nothing; a rotation re-seals under the new key at the first start, after which the old key opens nothing.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use sandkasten_server::config::SecretsConfig;
use sandkasten_server::seal::{KEY_BYTES, KeyId, SealKey, key_source};
use sandkasten_server::{ServerConfig, ServerError, Store, serve_on};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::fake::FakeRuntime;
use crate::harness::test_config;
use crate::tcp::{read_all, request};

/// A server running on `port` until `stop` is sent.
struct Running {
    port: u16,
    stop: oneshot::Sender<()>,
    server: JoinHandle<Result<(), ServerError>>,
}

impl Running {
    async fn call(&self, method: &str, path: &str, body: &str) -> String {
        read_all(request(self.port, method, path, body, "application/json").await).await
    }

    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.server.await.unwrap().unwrap();
    }
}

fn config(database: &Path, secrets: SecretsConfig) -> ServerConfig {
    ServerConfig { database: database.to_owned(), secrets, ..test_config() }
}

/// Starts a server; `Err` with the message when its start is refused.
async fn start(config: ServerConfig) -> Result<Running, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(serve_on(listener, config, Arc::new(FakeRuntime::default()), async {
        stopped.await.ok();
    }));
    // A refused start ends the task at once; a good one answers /healthz.
    for _ in 0..200 {
        if server.is_finished() {
            return Err(server.await.unwrap().err().map(|e| e.to_string()).unwrap_or_default());
        }
        if let Ok(stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            drop(stream);
            let running = Running { port, stop, server };
            if running.call("GET", "/healthz", "").await.starts_with("HTTP/1.1 200") {
                return Ok(running);
            }
            return Err("the server does not answer /healthz".into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    Err("the server did not start".into())
}

/// A key file (mode 0600) holding `[byte; 32]` in hex, and that key's id.
fn key_file(dir: &Path, name: &str, byte: u8) -> (PathBuf, KeyId) {
    let path = dir.join(name);
    std::fs::write(&path, format!("{byte:02x}").repeat(KEY_BYTES)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (path, SealKey::from_bytes(&[byte; KEY_BYTES]).unwrap().id())
}

fn with_key(path: &Path, previous: &[&Path]) -> SecretsConfig {
    SecretsConfig {
        key_file: Some(path.to_owned()),
        previous_key_files: previous.iter().map(|p| p.to_path_buf()).collect(),
        ..SecretsConfig::default()
    }
}

/// A distinctive value no test writes twice.
fn random_value() -> String {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut bytes).unwrap();
    format!("sk-live-{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

fn put_body(value: &str) -> String {
    serde_json::json!({ "value": value, "hosts": ["allowed.test"] }).to_string()
}

/// The database file and its `-wal` and `-shm` files, those that exist.
fn database_files(database: &Path) -> Vec<PathBuf> {
    ["", "-wal", "-shm"]
        .iter()
        .map(|suffix| PathBuf::from(format!("{}{suffix}", database.display())))
        .filter(|path| path.exists())
        .collect()
}

/// Where `needle` (as is, in lowercase and uppercase hex, in base64 with either alphabet) is in the database's files.
fn found_in_files(database: &Path, needle: &str) -> Vec<String> {
    let hex: String = needle.bytes().map(|b| format!("{b:02x}")).collect();
    let engines = [base64::engine::general_purpose::STANDARD_NO_PAD, base64::engine::general_purpose::URL_SAFE_NO_PAD];
    let forms =
        [needle.to_owned(), hex.clone(), hex.to_uppercase()].into_iter().chain(engines.map(|e| e.encode(needle)));
    let forms: Vec<String> = forms.collect();
    let mut found = Vec::new();
    for path in database_files(database) {
        let bytes = std::fs::read(&path).unwrap();
        for form in &forms {
            if bytes.windows(form.len()).any(|window| window == form.as_bytes()) {
                found.push(format!("{form} in {}", path.display()));
            }
        }
    }
    found
}

/// The tenant's secrets opened with the keys `secrets` names (the server stopped).
async fn opened_values(database: &Path, secrets: &SecretsConfig) -> Vec<(String, String)> {
    let keys = key_source::load(secrets, database).unwrap();
    let secrets = Store::open(database, keys).unwrap().secrets("alpha").await.unwrap();
    secrets.into_iter().map(|secret| (secret.name, secret.value)).collect()
}

#[tokio::test]
async fn a_secret_put_through_the_api_is_in_no_database_file_in_any_encoding() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("sandkasten.db");
    let running = start(config(&database, SecretsConfig::default())).await.unwrap();
    let (first, second) = (random_value(), random_value());
    let put = running.call("PUT", "/v1/secrets/API_TOKEN", &put_body(&first)).await;
    assert!(put.starts_with("HTTP/1.1 201"), "{put}");
    let put = running.call("PUT", "/v1/secrets/API_TOKEN", &put_body(&second)).await;
    assert!(put.starts_with("HTTP/1.1 200"), "{put}");
    let listed = running.call("GET", "/v1/secrets", "").await;
    assert!(listed.contains("API_TOKEN") && !listed.contains(&second) && !listed.contains(&first), "{listed}");
    // Positive control: the files are read and hold the row (its hosts are not sealed).
    assert!(!found_in_files(&database, "allowed.test").is_empty(), "the scan does not see the secrets' row");
    for value in [&first, &second] {
        let found = found_in_files(&database, value);
        assert!(found.is_empty(), "while running, the value is in the database files: {found:?}");
    }
    // A sandbox holding it: the value is opened for its egress proxy.
    let body = r#"{"secrets": ["API_TOKEN"], "network": {"mode": "allowlist", "allow": ["allowed.test"]}}"#;
    let created = running.call("POST", "/v1/sandboxes", body).await;
    assert!(created.starts_with("HTTP/1.1 201") && !created.contains(&second), "{created}");
    running.stop().await;
    for value in [&first, &second] {
        let found = found_in_files(&database, value);
        assert!(found.is_empty(), "after the stop, the value is in the database files: {found:?}");
    }
    // Sealed, not lost: the key made at the first start, next to the database, opens it.
    let key = key_source::default_key_file(&database);
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(opened_values(&database, &SecretsConfig::default()).await, [("API_TOKEN".to_owned(), second)]);
}

#[tokio::test]
async fn a_copy_of_the_database_without_its_key_does_not_start_and_loses_nothing() {
    let (dir, copy) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (database, copied) = (dir.path().join("sandkasten.db"), copy.path().join("sandkasten.db"));
    let (key_a, id_a) = key_file(dir.path(), "a.key", 0xa1);
    let (key_b, _) = key_file(copy.path(), "b.key", 0xb2);
    let value = random_value();
    let running = start(config(&database, with_key(&key_a, &[]))).await.unwrap();
    assert!(running.call("PUT", "/v1/secrets/API_TOKEN", &put_body(&value)).await.starts_with("HTTP/1.1 201"));
    running.stop().await;
    for path in database_files(&database) {
        std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
    }

    // Without a key (one is made next to the copy) and with another key: refused, naming the count and the key.
    for secrets in [SecretsConfig::default(), with_key(&key_b, &[])] {
        let refused = start(config(&copied, secrets.clone())).await.map(|_| ()).unwrap_err();
        assert!(refused.contains("1 secret value(s) are sealed with keys this server does not have"), "{refused}");
        assert!(refused.contains(&format!("key {id_a} sealed 1")) && refused.contains("key_file"), "{refused}");
        assert!(found_in_files(&copied, &value).is_empty() && !refused.contains(&value), "{refused}");
    }
    let rows: i64 = rusqlite::Connection::open(&copied)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM sealed_secrets", [], |row| row.get(0))
        .unwrap();
    assert_eq!(rows, 1, "a refused start dropped the secret");
    // With its key, the copy opens.
    start(config(&copied, with_key(&key_a, &[]))).await.unwrap().stop().await;
    assert_eq!(opened_values(&copied, &with_key(&key_a, &[])).await, [("API_TOKEN".to_owned(), value)]);
}

#[tokio::test]
async fn a_rotation_reseals_at_the_first_start_and_the_old_key_then_opens_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("sandkasten.db");
    let (key_a, id_a) = key_file(dir.path(), "a.key", 0xa1);
    let (key_b, id_b) = key_file(dir.path(), "b.key", 0xb2);
    let value = random_value();
    let running = start(config(&database, with_key(&key_a, &[]))).await.unwrap();
    assert!(running.call("PUT", "/v1/secrets/API_TOKEN", &put_body(&value)).await.starts_with("HTTP/1.1 201"));
    running.stop().await;

    // B with A as previous: it starts, and the secret is still there.
    let running = start(config(&database, with_key(&key_b, &[&key_a]))).await.unwrap();
    assert!(running.call("GET", "/v1/secrets", "").await.contains("API_TOKEN"));
    running.stop().await;
    // A alone no longer opens the database: everything is under B now.
    let refused = start(config(&database, with_key(&key_a, &[]))).await.map(|_| ()).unwrap_err();
    assert!(refused.contains(&format!("key {id_b} sealed 1")) && refused.contains(&id_a.to_string()), "{refused}");
    // B alone does.
    let running = start(config(&database, with_key(&key_b, &[]))).await.unwrap();
    let body = r#"{"secrets": ["API_TOKEN"], "network": {"mode": "allowlist", "allow": ["allowed.test"]}}"#;
    assert!(running.call("POST", "/v1/sandboxes", body).await.starts_with("HTTP/1.1 201"));
    running.stop().await;
    assert!(found_in_files(&database, &value).is_empty());
    assert_eq!(opened_values(&database, &with_key(&key_b, &[])).await, [("API_TOKEN".to_owned(), value)]);
}
