//! Real clients through the proxy, configured only by a sandbox's proxy environment
//! (`sandkasten_types::proxy_environment`, and the sandbox CA for HTTPS): curl and
//! Python's urllib, over plain HTTP and intercepted HTTPS, with OpenSSL's strict X.509 checks on the
//! interception CA. Skipped with a printed reason when a client is missing. Loopback only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use sandkasten_egress::{Decision, SandboxCa, Secret};
use sandkasten_types::proxy_environment;
use tokio::process::Command;

const PLACEHOLDER: &str = "SANDKASTEN_SECRET_PLACEHOLDER_api";
const REAL: &str = "sk_real_value_for_the_api";

fn have(program: &str) -> bool {
    let found = std::process::Command::new(program).arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        println!("skipped: {program} is not installed");
    }
    found
}

async fn run(program: &str, args: &[&str], proxy_port: u16) -> (bool, String) {
    let out = Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(proxy_environment(proxy_port))
        .output()
        .await
        .unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_and_python_work_through_the_proxy_and_get_the_secret_injected() {
    if !have("curl") || !have("/usr/bin/python3") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let upstream = tls_upstream().await;
    let (tls_port, tls_rx, upstream_ca) = (upstream.addr.port(), upstream.received.clone(), upstream.ca_file.clone());
    let (http, http_rx) = http_upstream().await;
    let mut cfg = loopback_config(&[]);
    cfg.upstream_ca_file = Some(upstream_ca);
    let ca = SandboxCa::generate("sb-real", &["allowed.test".to_owned()]).unwrap();
    let sandbox_ca = dir.path().join("sandbox-ca.pem");
    std::fs::write(&sandbox_ca, ca.cert_pem()).unwrap();
    let sandbox_ca = sandbox_ca.to_str().unwrap().to_owned();
    let p = start_proxy(cfg, allowlist(&["allowed.test"]), Some(ca)).await;
    let secret = Secret {
        name: "api".into(),
        value: REAL.into(),
        placeholder: PLACEHOLDER.into(),
        // TLS to allowed.test on any port; plain HTTP only to the port named.
        hosts: vec!["allowed.test".into(), format!("allowed.test:{}", http.port())],
        header: None,
    };
    p.sandbox.set_secrets(vec![secret]).unwrap();
    let port = p.addr.port();
    let auth = format!("Authorization: Bearer {PLACEHOLDER}");

    let url = format!("http://allowed.test:{}/plain", http.port());
    let (ok, out) = run("curl", &["-sS", "--fail", "-H", &auth, &url], port).await;
    assert!(ok && out == "hello", "curl http: {out}");
    assert!(http_rx.lock().unwrap()[0].0.contains(REAL), "secret not injected over plain HTTP");

    let url = format!("https://allowed.test:{tls_port}/tls");
    let (ok, out) = run("curl", &["-sS", "--fail", "--cacert", &sandbox_ca, "-H", &auth, &url], port).await;
    assert!(ok && out == "hello", "curl https: {out}");

    let (ok, out) = run("curl", &["-sS", "-o", "/dev/null", "-w", "%{http_connect}", "https://evil.test/"], port).await;
    assert!(!ok && out.starts_with("403"), "curl to a refused host: {out}");

    let script = format!(
        r#"
import ssl, urllib.request
ctx = ssl.create_default_context(cafile="{sandbox_ca}")
ctx.verify_flags |= ssl.VERIFY_X509_STRICT
req = urllib.request.Request("{url}", headers={{"Authorization": "Bearer {PLACEHOLDER}"}})
print(urllib.request.urlopen(req, context=ctx).read().decode(), end="")
"#
    );
    let (ok, out) = run("/usr/bin/python3", &["-c", &script], port).await;
    assert!(ok && out == "hello", "python urllib https (strict X.509): {out}");

    let received = tls_rx.lock().unwrap().clone();
    assert_eq!(received.len(), 2);
    for (head, _) in &received {
        assert!(head.contains(&format!("Bearer {REAL}")) && !head.contains(PLACEHOLDER), "{head}");
    }
    let events = p.audit.wait_for(4).await;
    assert_eq!(events.iter().filter(|e| e.decision == Decision::Allowed).count(), 3, "{events:#?}");
    assert_eq!(events.iter().filter(|e| e.decision == Decision::Refused).count(), 1, "{events:#?}");
}
