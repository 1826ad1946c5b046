//! Egress end to end, against a real server and real test hosts in network namespaces this test creates: the
//! default policy reaches nothing; an allowlisted name works from curl, urllib, requests, pip and git; everything
//! else — unlisted names, the metadata address however it is spelled or resolved, private ranges, raw sockets, DNS —
//! is refused or goes nowhere, which the test hosts' own request logs confirm; policy changes apply live; every
//! attempt is audited; a secret's value reaches only its host, in plain HTTP only to a port it names, through a CA
//! constrained to its hosts; a blind tunnel's ClientHello must name the CONNECT host.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod egress;
mod serve;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use serde_json::json;

use common::{Tier, accepted_within};
use egress::World;
use serve::{KEY_1, KEY_2, assert_sandbox_gone_on};

per_tier!(
    the_default_policy_reaches_nothing,
    an_allowlisted_name_works_from_common_clients,
    unlisted_names_special_addresses_and_odd_spellings_are_refused,
    raw_sockets_and_dns_go_nowhere_even_with_an_allowlist,
    policy_changes_apply_live_and_every_attempt_is_audited,
    a_secret_reaches_only_its_host_and_never_the_sandbox,
    a_header_rule_sets_its_header_toward_its_host_only_and_never_the_sandbox,
    a_secret_without_a_port_travels_over_tls_only_under_a_ca_constrained_to_its_hosts,
    a_tunnel_whose_client_hello_names_another_host_never_reaches_it,
    bad_network_input_is_refused_with_the_reason,
    the_proxy_door_closes_with_its_sandbox_or_policy,
    a_one_shot_run_through_the_server_gets_its_policy_and_a_local_one_refuses_it,
    a_process_squatting_the_proxy_port_gets_a_conflict_and_changes_nothing,
    the_servers_own_addresses_are_refused_even_inside_an_allowed_range,
    a_long_tunnel_is_in_the_audit_while_it_is_open,
    a_sandbox_killed_from_the_host_releases_its_door,
    a_pool_member_takes_the_policy_of_whoever_claims_it,
    creates_with_a_network_policy_never_fail_four_at_a_time,
    the_egress_door_works_again_after_a_pause,
);

/// A host loopback listener the sandbox must never reach; checked to be reachable from the host itself.
fn host_loopback_listener() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert_eq!(accepted_within(&listener, Duration::from_millis(200)), 1, "positive control");
    drop(probe);
    (listener, port)
}

fn allowlist(hosts: &[&str]) -> serde_json::Value {
    json!({ "mode": "allowlist", "allow": hosts })
}

/// `curl` through the sandbox's proxy settings: prints the HTTP status, then the body.
fn curl(url: &str) -> String {
    format!("curl -sS -m 10 -w '\\nSTATUS %{{http_code}}\\n' '{url}'")
}

fn the_default_policy_reaches_nothing(tier: Tier) {
    let world = World::start_on(tier, "");
    let (listener, port) = host_loopback_listener();
    let id = world.server.create_on(tier, json!({}));
    assert_eq!(world.server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None).json["network"]["mode"], "none");
    // Through the proxy variables: nothing listens on the proxy port (gVisor, microVM: the agent's bridge to the door
    // listens there from the start, and drops the connection while the host side of the door is shut).
    let (code, out, err) = world.sh(&id, &curl("http://allowed.test/whoami"));
    assert_ne!(code, 0, "{out}{err}");
    if tier != Tier::Process {
        assert!(err.contains("Connection reset by peer") || err.contains("Empty reply"), "{err}");
    } else {
        assert!(err.contains("Failed to connect") || err.contains("Couldn't connect"), "{err}");
    }
    // Directly, by address: no route; the host's loopback is the sandbox's own.
    let direct = format!(
        "/usr/bin/python3 -c \"import socket\nfor target in [('10.201.0.2', 80), ('169.254.169.254', 80), ('127.0.0.1', {port})]:\n    \
         s = socket.socket(); s.settimeout(2)\n    try:\n        s.connect(target); print('CONNECTED', target)\n    \
         except OSError as e: print('failed', target, e.errno)\""
    );
    let (_, out, err) = world.sh(&id, &direct);
    assert!(!out.contains("CONNECTED"), "{out}{err}");
    assert_eq!(out.matches("failed").count(), 3, "{out}{err}");
    assert_eq!(accepted_within(&listener, Duration::from_millis(300)), 0, "the host's loopback listener was reached");
    assert_eq!(world.allowed.requests(), "", "allowed.test was reached");
    assert_eq!(world.metadata.requests(), "", "the metadata server was reached");
    assert!(world.audit(&id, 0).is_empty(), "no proxy, no audit events");
}

fn an_allowlisted_name_works_from_common_clients(tier: Tier) {
    let world = World::start_on(tier, "");
    // pip's index and a git repository on allowed.test.
    build_package_index(world.allowed.dir());
    build_git_repository(world.allowed.dir());
    // `sh` runs up to the sandbox's command limit: 10 s by default, 60 s on an emulated CPU (a microVM under TCG,
    // where `python3 -m pip` alone takes seconds to start).
    let timeout_ms = if tier == Tier::Microvm { 60_000 } else { 10_000 };
    let id = world
        .server
        .create_on(tier, json!({ "network": allowlist(&["allowed.test"]), "limits": { "timeout_ms": timeout_ms } }));
    let (code, out, err) = world.sh(&id, &curl("http://allowed.test/whoami"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("hello from allowed.test") && out.contains("STATUS 200"), "{out}{err}");
    let clients = [
        (
            "urllib",
            "/usr/bin/python3 -c \"import urllib.request; print(urllib.request.urlopen('http://allowed.test/whoami').read().decode())\"",
        ),
        (
            "requests",
            "/usr/bin/python3 -c \"import requests; print(requests.get('http://allowed.test/whoami', timeout=10).text)\"",
        ),
        ("wget", "wget -q -O - http://allowed.test/whoami"),
        ("node fetch", "node -e \"fetch('http://allowed.test/whoami').then(r => r.text()).then(console.log)\""),
        (
            "node fetch POST",
            "node -e \"fetch('http://allowed.test/echo', {method: 'POST', body: 'hello from allowed.test'}).then(r => r.text()).then(console.log)\"",
        ),
    ];
    for (name, cmd) in clients {
        let (code, out, err) = world.sh(&id, cmd);
        assert_eq!(code, 0, "{name}: {out}{err}");
        assert!(out.contains("hello from allowed.test"), "{name}: {out}{err}");
    }
    // HTTPS through a blind tunnel (no secret: no interception), the test CA trusted explicitly.
    let ca = std::fs::read(world.test_ca()).unwrap();
    assert!(
        world.server.put_bytes(&format!("/v1/sandboxes/{id}/files?path=/tmp/test-ca.pem"), KEY_1, &ca).status < 300
    );
    let https_allowed = allowlist(&["allowed.test", "secure.test"]);
    assert_eq!(
        world.server.call("PUT", &format!("/v1/sandboxes/{id}/network"), KEY_1, Some(https_allowed)).status,
        200
    );
    for (name, cmd) in [
        ("curl https", "curl -sS -m 10 --cacert /tmp/test-ca.pem https://secure.test/whoami".to_owned()),
        (
            "node fetch https",
            "NODE_EXTRA_CA_CERTS=/tmp/test-ca.pem node -e \"fetch('https://secure.test/whoami').then(r => r.text()).then(console.log, e => { console.error(e.cause); process.exit(1) })\"".to_owned(),
        ),
    ] {
        let (code, out, err) = world.sh(&id, &cmd);
        assert_eq!(code, 0, "{name}: {out}{err}");
        assert!(out.contains("hello from secure.test"), "{name}: {out}{err}");
    }
    let (code, out, err) = world.sh(
        &id,
        "cd /tmp && /usr/bin/python3 -m pip download --no-deps --disable-pip-version-check -q \
         --index-url http://allowed.test/simple --trusted-host allowed.test -d /tmp/dl sktestpkg && ls /tmp/dl",
    );
    assert_eq!(code, 0, "pip: {out}{err}");
    assert!(out.contains("sktestpkg-1.0-py3-none-any.whl"), "pip: {out}{err}");
    let (code, out, err) = world.sh(&id, "git clone -q http://allowed.test/repo.git /tmp/repo && cat /tmp/repo/README");
    assert_eq!(code, 0, "git: {out}{err}");
    assert!(out.contains("cloned through the egress proxy"), "git: {out}{err}");
    // Host side: the requests arrived, and only at allowed.test.
    let seen = world.allowed.requests();
    for path in ["GET /whoami", "GET /simple/sktestpkg/", "GET /repo.git/info/refs"] {
        assert!(seen.contains(path), "allowed.test never saw {path:?}:\n{seen}");
    }
    assert_eq!(world.other.requests(), "");
}

/// A PEP 503 index serving one tiny wheel, `sktestpkg`.
fn build_package_index(root: &std::path::Path) {
    let dir = root.join("simple/sktestpkg");
    std::fs::create_dir_all(&dir).unwrap();
    let wheel = dir.join("sktestpkg-1.0-py3-none-any.whl");
    let script = format!(
        "import zipfile\nz = zipfile.ZipFile({:?}, 'w')\nz.writestr('sktestpkg/__init__.py', 'X = 1\\n')\n\
         z.writestr('sktestpkg-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: sktestpkg\\nVersion: 1.0\\n')\n\
         z.writestr('sktestpkg-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n\
         z.writestr('sktestpkg-1.0.dist-info/RECORD', '')\nz.close()\n",
        wheel.to_str().unwrap()
    );
    let status = std::process::Command::new("/usr/bin/python3").args(["-c", &script]).status().unwrap();
    assert!(status.success());
    std::fs::write(
        dir.join("index.html"),
        "<html><body><a href=\"sktestpkg-1.0-py3-none-any.whl\">sktestpkg-1.0-py3-none-any.whl</a></body></html>\n",
    )
    .unwrap();
}

/// A bare repository with one commit, served by git's dumb HTTP protocol (static files).
fn build_git_repository(root: &std::path::Path) {
    let work = tempfile::tempdir().unwrap();
    let git = |dir: &std::path::Path, args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    git(work.path(), &["init", "-q", "-b", "main"]);
    std::fs::write(work.path().join("README"), "cloned through the egress proxy\n").unwrap();
    git(work.path(), &["add", "README"]);
    git(work.path(), &["commit", "-q", "-m", "one"]);
    let bare = root.join("repo.git");
    git(root, &["clone", "-q", "--bare", work.path().to_str().unwrap(), bare.to_str().unwrap()]);
    git(&bare, &["update-server-info"]);
}

/// Sends `request` to the proxy from inside the sandbox, raw, and returns the proxy's answer (status line first).
fn raw_proxy_request(world: &World, id: &str, request: &str) -> String {
    const SCRIPT: &str = "import socket\n\
        s = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n\
        s.sendall(open('/tmp/request.txt', 'rb').read())\n\
        data = b''\n\
        while b'\\r\\n\\r\\n' not in data and len(data) < 65536:\n    \
            chunk = s.recv(65536)\n    \
            if not chunk: break\n    \
            data += chunk\n\
        print(data.decode(errors='replace'))\n";
    for (path, bytes) in [("/tmp/raw.py", SCRIPT.as_bytes()), ("/tmp/request.txt", request.as_bytes())] {
        let put = world.server.put_bytes(&format!("/v1/sandboxes/{id}/files?path={path}"), KEY_1, bytes);
        assert!(put.status < 300, "{put:?}");
    }
    let (_, out, err) = world.sh(id, "/usr/bin/python3 /tmp/raw.py");
    out + &err
}

fn unlisted_names_special_addresses_and_odd_spellings_are_refused(tier: Tier) {
    let world = World::start_on(tier, "");
    let (listener, port) = host_loopback_listener();
    for policy in [allowlist(&["allowed.test", "metadata.test", "private.test"]), json!({"mode": "open"})] {
        let id = world.sandbox_on(tier, policy.clone());
        // A name not in the list (in `open` mode: reachable in principle, but other.test resolves into a range the
        // operator allowed, so it works there; the allowlist refuses it).
        let (_, out, _) = world.sh(&id, &curl("http://other.test/whoami"));
        if policy["mode"] == "allowlist" {
            assert!(out.contains("STATUS 403") && out.contains("not in the allowlist"), "{policy}: {out}");
        }
        // Names whose static entry points at the metadata address or a private range nobody allowed.
        for name in ["metadata.test", "private.test"] {
            let (_, out, _) = world.sh(&id, &curl(&format!("http://{name}/latest")));
            assert!(out.contains("STATUS 403"), "{policy} {name}: {out}");
            assert!(out.contains("never allowed") || out.contains("special"), "{policy} {name}: {out}");
        }
        // The metadata address and the host's loopback, however spelled, through curl and raw requests.
        let spellings = [
            "169.254.169.254".to_owned(),
            "0xa9.0xfe.0xa9.0xfe".to_owned(),
            "2852039166".to_owned(),
            "[::ffff:169.254.169.254]".to_owned(),
            format!("127.0.0.1:{port}"),
            format!("0x7f.1:{port}"),
            format!("2130706433:{port}"),
            format!("017700000001:{port}"),
            format!("127.1:{port}"),
            format!("[::ffff:127.0.0.1]:{port}"),
            format!("[::1]:{port}"),
            format!("localhost:{port}"),
            format!("0.0.0.0:{port}"),
        ];
        for target in &spellings {
            let get = format!("GET http://{target}/latest HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
            let out = raw_proxy_request(&world, &id, &get);
            assert!(out.starts_with("HTTP/1.1 403"), "{policy} GET {target}: {out}");
            let has_port = target.rsplit_once(':').is_some_and(|(_, port)| !port.ends_with(']'));
            let authority = if has_port { target.clone() } else { format!("{target}:443") };
            let connect = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
            let out = raw_proxy_request(&world, &id, &connect);
            assert!(out.starts_with("HTTP/1.1 403"), "{policy} CONNECT {target}: {out}");
        }
        world.server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    }
    assert_eq!(world.metadata.requests(), "", "the metadata server was reached");
    assert_eq!(accepted_within(&listener, Duration::from_millis(300)), 0, "the host's loopback listener was reached");
}

fn raw_sockets_and_dns_go_nowhere_even_with_an_allowlist(tier: Tier) {
    let world = World::start_on(tier, "");
    let id = world.sandbox_on(tier, allowlist(&["allowed.test"]));
    let code = "import socket\n\
        for target in [('10.201.0.2', 80), ('169.254.169.254', 80), ('10.201.0.1', 22)]:\n    \
            s = socket.socket(); s.settimeout(2)\n    \
            try:\n        s.connect(target); print('TCP CONNECTED', target)\n    \
            except OSError as e: print('tcp failed', e.errno)\n\
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
        try:\n    u.sendto(b'x', ('10.201.0.2', 53)); print('UDP SENT')\n\
        except OSError as e: print('udp failed', e.errno)\n\
        try:\n    print('RESOLVED', socket.gethostbyname('allowed.test'))\n\
        except OSError as e: print('dns failed')\n";
    let put = world.server.put_bytes(&format!("/v1/sandboxes/{id}/files?path=/tmp/probe.py"), KEY_1, code.as_bytes());
    assert!(put.status < 300, "{put:?}");
    let (_, out, err) = world.sh(&id, "/usr/bin/python3 /tmp/probe.py");
    assert!(!out.contains("CONNECTED") && !out.contains("UDP SENT") && !out.contains("RESOLVED"), "{out}{err}");
    assert_eq!(out.matches("tcp failed").count(), 3, "{out}{err}");
    assert!(out.contains("udp failed") && out.contains("dns failed"), "{out}{err}");
    assert_eq!(world.allowed.requests(), "");
}

fn policy_changes_apply_live_and_every_attempt_is_audited(tier: Tier) {
    let world = World::start_on(tier, "");
    let id = world.server.create_on(tier, json!({}));
    let network = format!("/v1/sandboxes/{id}/network");
    // none → allowlist: the door opens without a restart.
    let reply = world.server.call("PUT", &network, KEY_1, Some(allowlist(&["allowed.test"])));
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.json["mode"], "allowlist");
    let (_, out, _) = world.sh(&id, &curl("http://allowed.test/whoami"));
    assert!(out.contains("STATUS 200"), "{out}");
    let (_, out, _) = world.sh(&id, &curl("http://other.test/whoami"));
    assert!(out.contains("STATUS 403"), "{out}");
    // allowlist with a deny that wins.
    let both = json!({"mode": "allowlist", "allow": ["*.test"], "deny": ["other.test"]});
    assert_eq!(world.server.call("PUT", &network, KEY_1, Some(both)).status, 200);
    let (_, out, _) = world.sh(&id, &curl("http://other.test/whoami"));
    assert!(out.contains("STATUS 403") && out.contains("deny"), "{out}");
    // → none: the door closes.
    assert_eq!(world.server.call("PUT", &network, KEY_1, Some(json!({"mode": "none"}))).status, 200);
    let (code, _, err) = world.sh(&id, &curl("http://allowed.test/whoami"));
    assert_ne!(code, 0, "{err}");
    assert_eq!(world.server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None).json["network"]["mode"], "none");
    // Audit: the allowed request with its address and bytes, then the two refusals with their rules.
    let events = world.audit(&id, 3);
    assert_eq!(events.len(), 3, "{events:#?}");
    assert_eq!(events[0]["decision"], "allowed");
    assert_eq!(events[0]["host"], "allowed.test");
    assert_eq!(events[0]["resolved"], "10.201.0.2");
    assert_eq!(events[0]["port"], 80);
    assert!(events[0]["bytes_down"].as_u64().unwrap() > 0, "{events:#?}");
    assert!(events[0]["bytes_up"].as_u64().unwrap() > 0, "{events:#?}");
    assert_eq!(events[1]["decision"], "refused");
    assert_eq!(events[1]["host"], "other.test");
    assert!(events[1]["rule"].as_str().unwrap().contains("allowlist"), "{events:#?}");
    assert!(events[2]["rule"].as_str().unwrap().contains("deny"), "{events:#?}");
    // The CLI shows the same trail.
    let cli = std::process::Command::new(common::bin())
        .args(["sandbox", "egress", &id, "--url", &world.server.url])
        .env("SANDKASTEN_API_KEY", KEY_1)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&cli.stdout);
    assert!(cli.status.success(), "{text}{}", String::from_utf8_lossy(&cli.stderr));
    assert!(text.contains("allowed.test:80") && text.contains("refused") && text.contains("10.201.0.2"), "{text}");
    // Metrics count the decisions.
    let metrics = world.metrics();
    assert!(metrics.contains("sandkasten_egress_requests_total{decision=\"allowed\"} 1"), "{metrics}");
    assert!(metrics.contains("sandkasten_egress_requests_total{decision=\"refused\"} 2"), "{metrics}");
    // Another tenant sees nothing of it.
    assert_eq!(world.server.call("GET", &format!("/v1/sandboxes/{id}/egress"), KEY_2, None).status, 404);
}

fn a_secret_reaches_only_its_host_and_never_the_sandbox(tier: Tier) {
    let world = World::start_on(tier, "");
    let value = "s3cr3t-0123456789-value";
    let put = world.server.call(
        "PUT",
        "/v1/secrets/API_TOKEN",
        KEY_1,
        // allowed.test is plain HTTP: its port must be named for the value to travel there in the clear.
        Some(json!({"value": value, "hosts": ["allowed.test:80", "secure.test"]})),
    );
    assert_eq!(put.status, 201, "{put:?}");
    assert!(!String::from_utf8_lossy(&put.body).contains(value), "the API echoed the value");
    let listed = world.server.call("GET", "/v1/secrets", KEY_1, None);
    assert!(!String::from_utf8_lossy(&listed.body).contains(value), "the list shows the value");
    assert_eq!(listed.json["secrets"][0]["name"], "API_TOKEN");
    let id = world.server.create_on(
        tier,
        json!({
            "network": allowlist(&["allowed.test", "other.test", "secure.test"]),
            "secrets": ["API_TOKEN"],
        }),
    );
    // Inside: a placeholder, and the value nowhere (environment of every process, files).
    let (_, placeholder, _) = world.sh(&id, "printf %s \"$API_TOKEN\"");
    assert!(placeholder.starts_with("sandkasten-secret-"), "{placeholder}");
    // The probe assembles the value from two halves, so that its own command line does not contain it.
    let (half_a, half_b) = value.split_at(8);
    let probe = format!(
        "import glob, os\nneedle = ({half_a:?} + {half_b:?}).encode()\nhits = []\n\
         def check(path):\n    \
             try:\n        \
                 if needle in open(path, 'rb').read(): hits.append(path)\n    \
             except OSError: pass\n\
         for path in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'): check(path)\n\
         for top in ['/workspace', '/tmp', '/etc']:\n    \
             for root, dirs, files in os.walk(top):\n        \
                 for name in files: check(os.path.join(root, name))\n\
         print('hits', hits)\n"
    );
    let put = world.server.put_bytes(&format!("/v1/sandboxes/{id}/files?path=/tmp/probe.py"), KEY_1, probe.as_bytes());
    assert!(put.status < 300, "{put:?}");
    let (_, out, err) = world.sh(&id, "/usr/bin/python3 /tmp/probe.py");
    assert_eq!(out.trim(), "hits []", "the value is visible inside: {out}{err}");
    // Sent to its host over HTTP, to another host, and to its host over HTTPS (intercepted with the sandbox's CA).
    let header = "-H \"Authorization: Bearer $API_TOKEN\"";
    let (_, out, _) = world.sh(&id, &format!("curl -sS -m 10 {header} http://allowed.test/whoami"));
    assert!(out.contains("hello from allowed.test"), "{out}");
    let (_, out, _) = world.sh(&id, &format!("curl -sS -m 10 {header} http://other.test/whoami"));
    assert!(out.contains("hello from other.test"), "{out}");
    let (code, out, err) = world.sh(&id, &format!("curl -sS -m 10 {header} https://secure.test/whoami"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("hello from secure.test"), "{out}{err}");
    // Host side: the value arrived where it may, the placeholder elsewhere.
    assert!(world.allowed.requests().contains(&format!("Bearer {value}")), "{}", world.allowed.requests());
    assert!(world.secure.requests().contains(&format!("Bearer {value}")), "{}", world.secure.requests());
    let other = world.other.requests();
    assert!(other.contains(&format!("Bearer {}", placeholder.trim())), "{other}");
    assert!(!other.contains(value), "the value reached other.test:\n{other}");
    // The stored sandbox shows the name only.
    let body = world.server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert!(!String::from_utf8_lossy(&body.body).contains(value));
    assert_eq!(body.json["secrets"][0], "API_TOKEN");
    // Rotating the value and narrowing the hosts applies to the running sandbox at once: allowed.test now gets the
    // placeholder (neither value), secure.test the new value.
    let rotated = "r0tated-9876543210-value";
    let put = world.server.call(
        "PUT",
        "/v1/secrets/API_TOKEN",
        KEY_1,
        Some(json!({"value": rotated, "hosts": ["secure.test"]})),
    );
    assert_eq!(put.status, 200, "{put:?}");
    world.sh(&id, &format!("curl -sS -m 10 {header} http://allowed.test/after-rotation"));
    let (code, out, err) = world.sh(&id, &format!("curl -sS -m 10 {header} https://secure.test/after-rotation"));
    assert_eq!(code, 0, "{out}{err}");
    let seen = world.allowed.requests();
    let after = &seen[seen.find("GET /after-rotation").expect("request arrived")..];
    assert!(after.contains(placeholder.trim()) && !after.contains(value) && !after.contains(rotated), "{after}");
    let seen = world.secure.requests();
    let after = &seen[seen.find("GET /after-rotation").expect("request arrived")..];
    assert!(after.contains(&format!("Bearer {rotated}")), "{after}");
    // Deleting the secret stops the substitution at once.
    assert_eq!(world.server.call("DELETE", "/v1/secrets/API_TOKEN", KEY_1, None).status, 204);
    world.sh(&id, &format!("curl -sS -m 10 {header} http://allowed.test/after-delete"));
    let seen = world.allowed.requests();
    let after = &seen[seen.find("GET /after-delete").expect("request arrived")..];
    assert!(!after.contains(value), "substituted after the delete:\n{after}");
}

fn a_header_rule_sets_its_header_toward_its_host_only_and_never_the_sandbox(tier: Tier) {
    let world = World::start_on(tier, "");
    let value = "h34der-0123456789-value";
    let put = world.server.call(
        "PUT",
        "/v1/secrets/RULE_TOKEN",
        KEY_1,
        Some(json!({"value": value, "hosts": ["secure.test"]})),
    );
    assert_eq!(put.status, 201, "{put:?}");
    let mut network = allowlist(&["allowed.test", "other.test", "secure.test"]);
    network["headers"] =
        json!([{"host": "secure.test", "name": "Authorization", "value": "Bearer ${secrets.RULE_TOKEN}"}]);
    // A rule toward a host the secret does not list is refused, naming it.
    let mut elsewhere = network.clone();
    elsewhere["headers"][0]["host"] = json!("other.test");
    let refused = world.server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"network": elsewhere})));
    assert_eq!(refused.status, 400, "{refused:?}");
    assert!(refused.json["error"].to_string().contains("other.test"), "{refused:?}");
    let id = world.server.create_on(tier, json!({"network": network}));
    // Inside: no variable holds it, and the value is in no process's environment or command line, nor any file.
    let (half_a, half_b) = value.split_at(8);
    let probe = format!(
        "import glob, os\nneedle = ({half_a:?} + {half_b:?}).encode()\nhits = []\n\
         def check(path):\n    \
             try:\n        \
                 if needle in open(path, 'rb').read(): hits.append(path)\n    \
             except OSError: pass\n\
         for path in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'): check(path)\n\
         for top in ['/workspace', '/tmp', '/etc']:\n    \
             for root, dirs, files in os.walk(top):\n        \
                 for name in files: check(os.path.join(root, name))\n\
         print('hits', hits)\n"
    );
    let put = world.server.put_bytes(&format!("/v1/sandboxes/{id}/files?path=/tmp/probe.py"), KEY_1, probe.as_bytes());
    assert!(put.status < 300, "{put:?}");
    let (_, out, err) = world.sh(&id, "/usr/bin/python3 /tmp/probe.py");
    assert_eq!(out.trim(), "hits []", "the value is visible inside: {out}{err}");
    // Over HTTPS to the rule's host: set, overriding what the sandbox sent. Elsewhere, and in plain HTTP: not.
    let header = "-H \"Authorization: Bearer chosen-inside\"";
    let (code, out, err) = world.sh(&id, &format!("curl -sS -m 10 {header} https://secure.test/with-rule"));
    assert_eq!(code, 0, "{out}{err}");
    // The test host serves no /with-rule: its 404 page says the request went through to it (its log, below, says how).
    assert!(out.contains("Error code: 404"), "{out}{err}");
    world.sh(&id, &format!("curl -sS -m 10 {header} http://other.test/no-rule"));
    world.sh(&id, &format!("curl -sS -m 10 {header} http://allowed.test/no-rule"));
    let seen = world.secure.requests();
    let after = &seen[seen.find("GET /with-rule").expect("request arrived")..];
    assert!(after.contains(&format!("Bearer {value}")) && !after.contains("chosen-inside"), "{after}");
    for other in [world.other.requests(), world.allowed.requests()] {
        assert!(!other.contains(value), "the value reached another host:\n{other}");
        assert!(other.contains("Bearer chosen-inside"), "{other}");
    }
    // The stored policy shows the placeholder, never the value.
    let body = world.server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert!(!String::from_utf8_lossy(&body.body).contains(value));
    assert!(String::from_utf8_lossy(&body.body).contains("${secrets.RULE_TOKEN}"), "{body:?}");
    // Rotation applies at once; deletion stops the header.
    let rotated = "r0tated-header-987654321";
    let put = world.server.call(
        "PUT",
        "/v1/secrets/RULE_TOKEN",
        KEY_1,
        Some(json!({"value": rotated, "hosts": ["secure.test"]})),
    );
    assert_eq!(put.status, 200, "{put:?}");
    let (code, out, err) = world.sh(&id, "curl -sS -m 10 https://secure.test/after-rotation");
    assert_eq!(code, 0, "{out}{err}");
    let seen = world.secure.requests();
    let after = &seen[seen.find("GET /after-rotation").expect("request arrived")..];
    assert!(after.contains(&format!("Bearer {rotated}")), "{after}");
    assert_eq!(world.server.call("DELETE", "/v1/secrets/RULE_TOKEN", KEY_1, None).status, 204);
    // With the secret gone nothing asks for the host to be intercepted any more, so the request may not get through
    // (the sandbox does not trust the test host's own certificate); whatever arrives carries no value.
    let logged = world.secure.requests().len();
    world.sh(&id, "curl -sS -m 10 https://secure.test/after-delete");
    let seen = world.secure.requests();
    let later = &seen[logged..];
    assert!(!later.contains(rotated) && !later.contains(value), "set after the delete:\n{later}");
}

/// The last certificate of a PEM bundle inside the sandbox (the interception CA: the server appends it).
fn last_certificate_in(world: &World, id: &str, path: &str) -> String {
    let script = format!("s = open('{path}').read(); print(s[s.rfind('-----BEGIN CERTIFICATE-----'):], end='')");
    let (code, out, err) = world.sh(id, &format!("/usr/bin/python3 -c \"{script}\""));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("-----BEGIN CERTIFICATE-----"), "{out}");
    out
}

/// `openssl x509 <args>` on a PEM certificate, on the host: (success, stdout + stderr).
fn openssl_x509(pem: &str, args: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cert.pem");
    std::fs::write(&path, pem).unwrap();
    let out = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-in", path.to_str().unwrap()])
        .args(args)
        .output()
        .expect("run openssl");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn a_secret_without_a_port_travels_over_tls_only_under_a_ca_constrained_to_its_hosts(tier: Tier) {
    let world = World::start_on(tier, "");
    let value = "tls-only-0123456789-value";
    let put = world.server.call(
        "PUT",
        "/v1/secrets/API_TOKEN",
        KEY_1,
        Some(json!({"value": value, "hosts": ["allowed.test", "secure.test"]})),
    );
    assert_eq!(put.status, 201, "{put:?}");
    let id = world.server.create_on(
        tier,
        json!({"network": allowlist(&["allowed.test", "secure.test", "other.test"]), "secrets": ["API_TOKEN"]}),
    );
    let header = "-H \"Authorization: Bearer $API_TOKEN\"";
    // Plain HTTP to a host named without a port: the placeholder goes, never the value.
    let (code, out, err) = world.sh(&id, &format!("curl -sS -m 10 {header} http://allowed.test/plain-no-port"));
    assert_eq!(code, 0, "{out}{err}");
    let seen = world.allowed.requests();
    let plain = &seen[seen.find("GET /plain-no-port").expect("request arrived")..];
    assert!(plain.contains("Bearer sandkasten-secret-") && !plain.contains(value), "value sent in the clear:\n{plain}");
    // HTTPS to a host named without a port: intercepted, the value arrives.
    let (code, out, err) = world.sh(&id, &format!("curl -sS -m 10 {header} https://secure.test/tls-no-port"));
    assert_eq!(code, 0, "{out}{err}");
    let seen = world.secure.requests();
    let tls = &seen[seen.find("GET /tls-no-port").expect("request arrived")..];
    assert!(tls.contains(&format!("Bearer {value}")), "positive control over TLS:\n{tls}");
    // Naming the plain port lets plain HTTP carry it (applies to the running sandbox at once).
    let put = world.server.call(
        "PUT",
        "/v1/secrets/API_TOKEN",
        KEY_1,
        Some(json!({"value": value, "hosts": ["allowed.test:80", "secure.test", "other.test"]})),
    );
    assert_eq!(put.status, 200, "{put:?}");
    world.sh(&id, &format!("curl -sS -m 10 {header} http://allowed.test/plain-named-port"));
    let seen = world.allowed.requests();
    let named = &seen[seen.find("GET /plain-named-port").expect("request arrived")..];
    assert!(named.contains(&format!("Bearer {value}")), "{named}");

    // The CA the sandbox trusts is constrained to the hosts of its creation and short-lived.
    let ca = last_certificate_in(&world, &id, "/tmp/.sandkasten-ca-bundle.pem");
    let (ok, text) = openssl_x509(&ca, &["-text"]);
    assert!(ok, "{text}");
    assert!(text.contains("X509v3 Name Constraints: critical"), "{text}");
    let constraints = &text[text.find("Name Constraints").unwrap()..];
    let permitted = &constraints[constraints.find("Permitted:").expect("permitted subtrees")..];
    let permitted = &permitted[..permitted.find("Excluded:").expect("excluded subtrees")];
    assert!(permitted.contains("DNS:allowed.test") && permitted.contains("DNS:secure.test"), "{constraints}");
    assert!(!permitted.contains("other.test"), "a host added later widened the CA: {constraints}");
    let every_address = ["IP:0.0.0.0/0.0.0.0", "IP:0:0:0:0:0:0:0:0/0:0:0:0:0:0:0:0"];
    assert!(every_address.iter().all(|ip| constraints.contains(ip)), "{constraints}");
    // `-checkend N` fails when the certificate ends within N seconds: at most 8 days (+1 min) from now.
    let (ends_within_bound, _) = openssl_x509(&ca, &["-checkend", &(8 * 86_400 + 60).to_string()]);
    assert!(!ends_within_bound, "the CA is valid for more than 8 days");
    let (valid_a_week, _) = openssl_x509(&ca, &["-checkend", &(7 * 86_400).to_string()]);
    assert!(valid_a_week, "positive control: the CA outlasts the longest sandbox lifetime one grant gives");
    // The leaf presented for secure.test is shorter still (at most a day); for other.test, added to the secret after
    // the CA was made, the proxy mints none: that tunnel stays blind (other.test speaks no TLS, so no certificate).
    let s_client = |host: &str, port: u16| {
        format!(
            "timeout 5 openssl s_client -proxy 127.0.0.1:3128 -connect {host}:{port} -servername {host} -showcerts </dev/null \
             2>&1 | sed -n '/-----BEGIN CERTIFICATE-----/,/-----END CERTIFICATE-----/p' | sed '/-----END/q'"
        )
    };
    let (_, leaf, _) = world.sh(&id, &s_client("secure.test", 443));
    assert!(leaf.starts_with("-----BEGIN CERTIFICATE-----"), "{leaf}");
    let (ok, subject) = openssl_x509(&leaf, &["-subject", "-issuer"]);
    assert!(ok && subject.contains("secure.test") && subject.contains("sandkasten egress CA"), "{subject}");
    let (ends_within_a_day, _) = openssl_x509(&leaf, &["-checkend", &(86_400 + 60).to_string()]);
    assert!(!ends_within_a_day, "the leaf is valid for more than a day");
    let (_, other, _) = world.sh(&id, &s_client("other.test", 80));
    assert!(other.is_empty(), "the proxy presented a certificate for other.test: {other}");
}

fn a_tunnel_whose_client_hello_names_another_host_never_reaches_it(tier: Tier) {
    let world = World::start_on(tier, "");
    // Both names are allowed; a CONNECT to one still may not carry a ClientHello for the other.
    let id = world.server.create_on(tier, json!({"network": allowlist(&["secure.test", "other.test"])}));
    const SCRIPT: &str = r#"
import socket, ssl
def tunnel(host, port):
    s = socket.create_connection(('127.0.0.1', 3128), timeout=10)
    s.sendall(f'CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n'.encode())
    head = b''
    while b'\r\n\r\n' not in head:
        byte = s.recv(1)
        if not byte:
            raise SystemExit('proxy closed before answering')
        head += byte
    assert head.startswith(b'HTTP/1.1 200'), head
    return s
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
for sni in ['other.test', None, 'secure.test']:
    try:
        t = ctx.wrap_socket(tunnel('secure.test', 443), server_hostname=sni)
        t.sendall(b'GET /whoami HTTP/1.1\r\nHost: secure.test\r\nConnection: close\r\n\r\n')
        body = b''
        while chunk := t.recv(4096):
            body += chunk
        print(sni, 'ANSWERED', body.decode().strip().splitlines()[-1])
    except (ssl.SSLError, OSError) as e:
        print(sni, 'REFUSED', e)
s = tunnel('secure.test', 443)
s.sendall(b'GET /whoami HTTP/1.1\r\nHost: other.test\r\n\r\n')
print('plain', 'ANSWERED' if s.recv(100) else 'CLOSED')
"#;
    let put = world.server.put_bytes(&format!("/v1/sandboxes/{id}/files?path=/tmp/sni.py"), KEY_1, SCRIPT.as_bytes());
    assert!(put.status < 300, "{put:?}");
    let (code, out, err) = world.sh(&id, "/usr/bin/python3 /tmp/sni.py");
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}{err}");
    assert!(lines[0].starts_with("other.test REFUSED") && lines[0].contains("ACCESS_DENIED"), "{out}");
    assert!(lines[1].starts_with("None REFUSED") && lines[1].contains("ACCESS_DENIED"), "{out}");
    assert_eq!(lines[2], "secure.test ANSWERED hello from secure.test", "positive control: {out}");
    assert_eq!(lines[3], "plain CLOSED", "{out}");
    // Host side: secure.test saw exactly one ClientHello, the matching one; the refused tunnels sent it nothing.
    let log = world.secure.requests();
    let names: Vec<&str> = log.lines().filter_map(|l| l.strip_prefix("TLS-SNI ")).collect();
    assert_eq!(names, ["secure.test"], "{log}");
    assert_eq!(log.lines().filter(|l| *l == "TLS-OK").count(), 1, "{log}");
    assert_eq!(log.matches("GET /whoami").count(), 1, "{log}");
    // Each refusal is audited with its reason, closing the record of the connection it ended (written a moment after
    // the client saw the close).
    let deadline = Instant::now() + Duration::from_secs(5);
    let (events, rules) = loop {
        let events = world.audit(&id, 4);
        let rules: Vec<String> = events
            .iter()
            .filter(|e| e["decision"] == "refused")
            .filter_map(|e| e["rule"].as_str())
            .map(|rule| rule.split(':').next().unwrap_or_default().to_owned())
            .collect();
        if rules.len() >= 3 || Instant::now() > deadline {
            break (events, rules);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(rules, ["sni_mismatch", "sni_missing", "not_tls"], "{events:#?}");
    assert_eq!(events.len(), 4, "one record per tunnel: {events:#?}");
    assert!(events.iter().filter(|e| e["decision"] == "refused").all(|e| e["connection"].is_u64()), "{events:#?}");
}

fn bad_network_input_is_refused_with_the_reason(tier: Tier) {
    let world = World::start_on(tier, "");
    let create = |network: serde_json::Value| {
        world.server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"network": network})))
    };
    for (network, needle) in [
        (allowlist(&["exa mple.com"]), "exa mple.com"),
        (allowlist(&["example.com:99999"]), "99999"),
        (allowlist(&["*"]), "*"),
        (json!({"mode": "none", "allow": ["a.example"]}), "allowlist"),
        (json!({"mode": "sideways"}), "sideways"),
    ] {
        let reply = create(network.clone());
        assert!(matches!(reply.status, 400 | 422), "{network}: {reply:?}");
        assert!(reply.json["error"]["message"].as_str().unwrap_or("").contains(needle), "{network}: {reply:?}");
    }
    let reply = world.server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"secrets": ["NOPE"]})));
    assert_eq!(reply.status, 422, "{reply:?}");
    assert!(reply.json["error"]["message"].as_str().unwrap().contains("NOPE"));
    for (name, body) in [
        ("1BAD", json!({"value": "v", "hosts": ["a.example"]})),
        ("GOOD", json!({"value": "v", "hosts": []})),
        ("GOOD", json!({"value": "v", "hosts": ["bad host"]})),
        ("GOOD", json!({"value": "v", "hosts": ["api.example.com", "*.com"]})),
        ("GOOD", json!({"value": "line\nbreak", "hosts": ["a.example"]})),
    ] {
        let reply = world.server.call("PUT", &format!("/v1/secrets/{name}"), KEY_1, Some(body.clone()));
        assert_eq!(reply.status, 400, "{name} {body}: {reply:?}");
    }
    // A secret named like a variable sandkasten sets would override it inside (the proxy, the CA bundle, ...).
    for name in ["HTTP_PROXY", "https_proxy", "NO_PROXY", "NODE_OPTIONS", "SSL_CERT_FILE", "PATH", "HOME"] {
        let body = json!({"value": "http://attacker.example", "hosts": ["a.example"]});
        let reply = world.server.call("PUT", &format!("/v1/secrets/{name}"), KEY_1, Some(body));
        assert_eq!(reply.status, 422, "{name}: {reply:?}");
        assert!(reply.json["error"]["message"].as_str().unwrap_or("").contains("sandkasten sets"), "{reply:?}");
    }
    let listed = world.server.call("GET", "/v1/secrets", KEY_1, None);
    assert_eq!(listed.json["secrets"].as_array().map(Vec::len), Some(0), "a refused secret was stored: {listed:?}");
    let id = world.server.create_on(tier, json!({}));
    let network = format!("/v1/sandboxes/{id}/network");
    let reply = world.server.call("PUT", &network, KEY_1, Some(allowlist(&["bad..name"])));
    assert_eq!(reply.status, 400, "{reply:?}");
    assert!(reply.json["error"]["message"].as_str().unwrap().contains("bad..name"), "{reply:?}");
    assert_eq!(world.server.call("PUT", &network, KEY_2, Some(allowlist(&["a.example"]))).status, 404);
    assert_eq!(world.server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_eq!(world.server.call("PUT", &network, KEY_1, Some(allowlist(&["a.example"]))).status, 409);
    let missing = "/v1/sandboxes/sb-0000000000000000/network";
    assert_eq!(world.server.call("PUT", missing, KEY_1, Some(allowlist(&["a.example"]))).status, 404);
}

/// The host inode of sandbox `id`'s egress door while the server listens at it: on the process tier the proxy's
/// listener inside the sandbox's network namespace (from the sandbox's own `/proc/net/tcp`: 127.0.0.1:3128, LISTEN),
/// on gVisor the host's listening unix socket in the sandbox's bundle (the agent bridges 127.0.0.1:3128 to it), on
/// a microVM the host's listening unix socket in its directory (the host connects the door port's streams to it).
fn door_inode(tier: Tier, world: &World, id: &str) -> Option<String> {
    let host_socket = match tier {
        Tier::Gvisor => Some(format!("{}/{id}/door/proxy.sock", common::GVISOR_BUNDLES)),
        Tier::Microvm => Some(common::microvm::state_dir_of(id).join("door.sock").display().to_string()),
        _ => None,
    };
    if let Some(path) = host_socket {
        let table = std::fs::read_to_string("/proc/net/unix").unwrap();
        return table.lines().find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // Num RefCount Protocol Flags Type St Inode Path; flags 00010000: listening.
            (fields.get(7) == Some(&path.as_str()) && fields[3] == "00010000").then(|| fields[6].to_owned())
        });
    }
    let (_, out, _) = world.sh(id, "cat /proc/net/tcp");
    out.lines()
        .find(|line| line.contains("0100007F:0C38") && line.split_whitespace().nth(3) == Some("0A"))
        .map(|line| line.split_whitespace().nth(9).unwrap_or_default().to_owned())
}

/// Whether any process on the host still holds socket `inode`.
fn socket_held(inode: &str) -> bool {
    let needle = format!("socket:[{inode}]");
    std::fs::read_dir("/proc").unwrap().flatten().any(|process| {
        std::fs::read_dir(process.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.to_string_lossy() == needle))
    })
}

fn the_proxy_door_closes_with_its_sandbox_or_policy(tier: Tier) {
    let world = World::start_on(tier, "");
    let id = world.sandbox_on(tier, allowlist(&["allowed.test"]));
    let inode = door_inode(tier, &world, &id).expect("the proxy listens inside the sandbox");
    assert!(socket_held(&inode), "positive control: the server holds the door");
    // Policy none closes it.
    world.server.call("PUT", &format!("/v1/sandboxes/{id}/network"), KEY_1, Some(json!({"mode": "none"})));
    if tier != Tier::Process {
        // The door's listener is dropped asynchronously after the answer (ProxyHandle's drop); on the process tier
        // the exec that reads the sandbox's /proc/net/tcp takes longer than that, the host's own table does not.
        let deadline = Instant::now() + Duration::from_secs(2);
        while (door_inode(tier, &world, &id).is_some() || socket_held(&inode)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(door_inode(tier, &world, &id).is_none(), "still listening after the policy became none");
    assert!(!socket_held(&inode), "the server still holds the door");
    // Deleting the sandbox closes a reopened one, and nothing of the sandbox is left.
    world.server.call("PUT", &format!("/v1/sandboxes/{id}/network"), KEY_1, Some(allowlist(&["allowed.test"])));
    let inode = door_inode(tier, &world, &id).expect("reopened");
    assert_eq!(world.server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert!(!socket_held(&inode), "the door outlived its sandbox");
    assert_sandbox_gone_on(tier, &id);
}

fn a_one_shot_run_through_the_server_gets_its_policy_and_a_local_one_refuses_it(tier: Tier) {
    let world = World::start_on(tier, "");
    let run_remote = |extra: &[&str]| {
        std::process::Command::new(common::bin())
            .args(["run", "--isolation", tier.name(), "--server", &world.server.url])
            .args(extra)
            .args(["--", "curl", "-sSf", "-m", "10", "http://allowed.test/whoami"])
            .env("SANDKASTEN_API_KEY", KEY_1)
            .output()
            .unwrap()
    };
    let allowed = run_remote(&["--allow", "allowed.test"]);
    let text = String::from_utf8_lossy(&allowed.stdout);
    assert_eq!(allowed.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&allowed.stderr));
    assert!(text.contains("hello from allowed.test"), "{text}");
    let refused = run_remote(&["--allow", "other.test"]);
    assert_ne!(refused.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("403"), "{}", String::from_utf8_lossy(&refused.stderr));
    let none = run_remote(&[]);
    assert_ne!(none.status.code(), Some(0), "no policy, no network");
    assert_eq!(world.allowed.requests().matches("GET /whoami").count(), 1, "{}", world.allowed.requests());
    // Locally there is no proxy: the flag is refused before anything is created.
    let local = std::process::Command::new(common::bin())
        .args(["run", "--isolation", tier.name(), "--allow", "allowed.test", "--", "true"])
        .env_remove("SANDKASTEN_SERVER")
        .output()
        .unwrap();
    assert_eq!(local.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&local.stderr).contains("--server"), "{}", String::from_utf8_lossy(&local.stderr));
}

fn a_process_squatting_the_proxy_port_gets_a_conflict_and_changes_nothing(tier: Tier) {
    let world = World::start_on(tier, "");
    let id = world.server.create_on(tier, json!({}));
    if tier != Tier::Process {
        // gVisor and microVM: the agent's bridge to the door holds 127.0.0.1:3128 inside from the sandbox's start,
        // whatever the policy: code cannot squat the port, and a policy change applies.
        let bind = "/usr/bin/python3 -c \"import socket; socket.socket().bind(('127.0.0.1', 3128))\"";
        let (code, out, err) = world.sh(&id, bind);
        assert!(code != 0 && err.contains("Address already in use"), "the squatter bound the port: {out}{err}");
        let network = format!("/v1/sandboxes/{id}/network");
        let reply = world.server.call("PUT", &network, KEY_1, Some(allowlist(&["allowed.test"])));
        assert_eq!(reply.status, 200, "{reply:?}");
        let (_, out, _) = world.sh(&id, &curl("http://allowed.test/whoami"));
        assert!(out.contains("STATUS 200"), "{out}");
        assert_eq!(world.server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
        assert_sandbox_gone_on(tier, &id);
        return;
    }
    // While the policy is none, code inside binds the proxy's port itself (it could then play proxy to its own
    // clients, which is harmless; the server must not report its own failure, nor half-apply the policy).
    let squat = "import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', 3128))\ns.listen()\ntime.sleep(60)\n";
    let put = world.server.put_bytes(&format!("/v1/sandboxes/{id}/files?path=/tmp/squat.py"), KEY_1, squat.as_bytes());
    assert!(put.status < 300, "{put:?}");
    let started = world.server.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        KEY_1,
        Some(json!({"cmd": "/usr/bin/python3 /tmp/squat.py", "background": true})),
    );
    assert!(started.status < 300, "{started:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while door_inode(tier, &world, &id).is_none() {
        assert!(Instant::now() < deadline, "the squatter never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    let network = format!("/v1/sandboxes/{id}/network");
    let reply = world.server.call("PUT", &network, KEY_1, Some(allowlist(&["allowed.test"])));
    assert_eq!(reply.status, 409, "{reply:?}");
    let message = reply.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("3128") && message.contains("in use"), "{reply:?}");
    assert_eq!(world.server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None).json["network"]["mode"], "none");
    assert_eq!(world.server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
}

fn the_servers_own_addresses_are_refused_even_inside_an_allowed_range(tier: Tier) {
    let world = World::start_on(tier, "");
    // 10.201.0.1 is the host's end of allowed.test's veth: an address of the server's own host, inside the range the
    // operator allowed for the test hosts. A service of the host listening there (or on 0.0.0.0, or on a public
    // address of the host) must stay out of reach: the operator allowed a network, not the host itself.
    let listener = TcpListener::bind("10.201.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = std::net::TcpStream::connect(("10.201.0.1", port)).unwrap();
    assert_eq!(accepted_within(&listener, Duration::from_millis(200)), 1, "positive control");
    drop(probe);
    let id = world.sandbox_on(tier, json!({"mode": "open"}));
    let (_, out, _) = world.sh(&id, &curl("http://allowed.test/whoami"));
    assert!(out.contains("STATUS 200"), "positive control: the allowed range works: {out}");
    let get = format!("GET http://10.201.0.1:{port}/ HTTP/1.1\r\nHost: 10.201.0.1\r\nConnection: close\r\n\r\n");
    let out = raw_proxy_request(&world, &id, &get);
    assert!(out.starts_with("HTTP/1.1 403") && out.contains("this host"), "GET: {out}");
    let connect = format!("CONNECT 10.201.0.1:{port} HTTP/1.1\r\nHost: 10.201.0.1:{port}\r\n\r\n");
    let out = raw_proxy_request(&world, &id, &connect);
    assert!(out.starts_with("HTTP/1.1 403"), "CONNECT: {out}");
    assert_eq!(accepted_within(&listener, Duration::from_millis(300)), 0, "the host's own service was reached");
}

fn a_long_tunnel_is_in_the_audit_while_it_is_open(tier: Tier) {
    let world = World::start_on(tier, "");
    let id = world.sandbox_on(tier, allowlist(&["allowed.test"]));
    // A tunnel that stays open for a while before it carries anything (as a slow exfiltration would).
    let script = "import socket, time\n\
        s = socket.create_connection(('127.0.0.1', 3128), timeout=30)\n\
        s.sendall(b'CONNECT allowed.test:80 HTTP/1.1\\r\\nHost: allowed.test:80\\r\\n\\r\\n')\n\
        assert s.recv(4096).startswith(b'HTTP/1.1 200')\n\
        while not __import__('os').path.exists('/tmp/go'): time.sleep(0.05)\n\
        s.sendall(b'GET /whoami HTTP/1.1\\r\\nHost: allowed.test\\r\\nConnection: close\\r\\n\\r\\n')\n\
        while s.recv(65536): pass\n";
    let put =
        world.server.put_bytes(&format!("/v1/sandboxes/{id}/files?path=/tmp/tunnel.py"), KEY_1, script.as_bytes());
    assert!(put.status < 300, "{put:?}");
    let started = world.server.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        KEY_1,
        Some(json!({"cmd": "/usr/bin/python3 /tmp/tunnel.py", "background": true})),
    );
    assert!(started.status < 300, "{started:?}");
    let events = world.audit(&id, 1);
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!((events[0]["decision"].as_str(), events[0]["open"].as_bool()), (Some("allowed"), Some(true)));
    assert_eq!(events[0]["scheme"], "connect");
    // Let it talk and end: the same record now carries the bytes.
    world.sh(&id, "touch /tmp/go");
    let deadline = Instant::now() + Duration::from_secs(10);
    let closed = loop {
        let events = world.audit(&id, 1);
        if events.len() == 1 && events[0]["open"] == false {
            break events[0].clone();
        }
        assert!(Instant::now() < deadline, "the tunnel's record never closed: {events:#?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(closed["bytes_down"].as_u64().unwrap() > 0 && closed["bytes_up"].as_u64().unwrap() > 0, "{closed}");
    assert_eq!(closed["connection"], events[0]["connection"]);
    assert!(world.allowed.requests().contains("GET /whoami"));
}

fn a_sandbox_killed_from_the_host_releases_its_door(tier: Tier) {
    let world = World::start_on(tier, "");
    let id = world.sandbox_on(tier, allowlist(&["allowed.test"]));
    let inode = door_inode(tier, &world, &id).expect("the proxy listens inside the sandbox");
    assert!(socket_held(&inode), "positive control: the server holds the door");
    let procs = common::cgroup_paths(&id)
        .into_iter()
        .find_map(|path| std::fs::read_to_string(path.join("cgroup.procs")).ok())
        .expect("the sandbox's cgroup.procs");
    for pid in procs.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
        // SAFETY: kill(2) of this test's sandbox's processes, found in its cgroup.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert_sandbox_gone_on(tier, &id);
    // The next call finds it gone: the sandbox is marked lost and the server lets go of its door (the socket
    // would otherwise keep the dead sandbox's network namespace alive).
    let reply = world.server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(json!({"cmd": "true"})));
    assert!(reply.status == 409 || reply.status == 404, "{reply:?}");
    let state = world.server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_eq!(state.json["state"], "lost", "{state:?}");
    assert!(!socket_held(&inode), "the door of a lost sandbox is still held");
}

fn a_pool_member_takes_the_policy_of_whoever_claims_it(tier: Tier) {
    let world = World::start_on(tier, "[[pools]]\nname = \"std\"\nmin = 2\nmax = 2\n");
    let pool_hits = || -> f64 {
        world
            .metrics()
            .lines()
            .find_map(|l| l.strip_prefix("sandkasten_pool_hits_total "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while world.server.call("GET", "/v1/pools", KEY_1, None).json["pools"][0]["ready"] != 2 {
        assert!(Instant::now() < deadline, "the pool never filled");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Two members of one pool, one claimed with no network and one with an allowlist.
    let closed = world.server.create_on(tier, json!({}));
    let open = world.sandbox_on(tier, allowlist(&["allowed.test"]));
    assert_eq!(pool_hits(), 2.0, "both came from the pool");
    let (code, _, err) = world.sh(&closed, &curl("http://allowed.test/whoami"));
    assert_ne!(code, 0, "the member claimed without a policy reached out: {err}");
    let (_, out, _) = world.sh(&open, &curl("http://allowed.test/whoami"));
    assert!(out.contains("hello from allowed.test"), "{out}");
    let (_, out, _) = world.sh(&open, &curl("http://other.test/whoami"));
    assert!(out.contains("STATUS 403"), "{out}");
    assert_eq!(world.allowed.requests().matches("GET /whoami").count(), 1, "{}", world.allowed.requests());
    assert_eq!(world.other.requests(), "");
}

/// Opening a sandbox's egress door races nothing: creates with a network policy, four at a time, all succeed (once in
/// ~190 creates the door's listener used to be bound before the sandbox's loopback was up: `EADDRNOTAVAIL`, a 500).
/// 500 creates on the process tier (whose door is a listener in the sandbox's network namespace); 40 on gVisor (a
/// unix socket; each create starts a gVisor sandbox).
fn creates_with_a_network_policy_never_fail_four_at_a_time(tier: Tier) {
    let total = if tier == Tier::Process { 500 } else { 40 };
    let server = std::sync::Arc::new(serve::Server::start_on(tier));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let server = std::sync::Arc::clone(&server);
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                for _ in 0..total / 4 {
                    let body = json!({"isolation": tier.name(), "network": allowlist(&["allowed.test"])});
                    let created = server.call("POST", "/v1/sandboxes", KEY_1, Some(body));
                    if created.status != 201 {
                        failures.push(format!("create: {} {}", created.status, created.json));
                        continue;
                    }
                    let id = created.json["id"].as_str().unwrap().to_owned();
                    let deleted = server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
                    if deleted.status != 204 {
                        failures.push(format!("delete {id}: {} {}", deleted.status, deleted.json));
                    }
                }
                failures
            })
        })
        .collect();
    let failures: Vec<String> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    assert!(
        failures.is_empty(),
        "{} of {total} creates or deletes failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}

fn the_egress_door_works_again_after_a_pause(tier: Tier) {
    let world = World::start_on(tier, "");
    let id = world.sandbox_on(tier, allowlist(&["allowed.test"]));
    let (code, out, err) = world.sh(&id, &curl("http://allowed.test/whoami"));
    assert!(code == 0 && out.contains("STATUS 200"), "{out}{err}");
    // A connection through the door is open while the sandbox pauses (gVisor: runsc cannot save a connection to a
    // host socket, so the agent closes the door's before the checkpoint; the one inside sees its end).
    let hold = "/usr/bin/python3 -c \"import socket\ns = socket.create_connection(('127.0.0.1', 3128))\nprint('open', flush=True)\nprint('ended' if s.recv(1) == b'' else 'data', flush=True)\"";
    let body = json!({"cmd": hold, "background": true});
    let held = world.server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(body));
    assert_eq!(held.status, 202, "{held:?}");
    std::thread::sleep(Duration::from_millis(1500));
    for action in ["pause", "resume"] {
        let reply = world.server.call("POST", &format!("/v1/sandboxes/{id}/{action}"), KEY_1, None);
        assert_eq!(reply.status, 200, "{action} with a connection open through the door: {reply:?}");
    }
    let (code, out, err) = world.sh(&id, &curl("http://allowed.test/whoami"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("hello from allowed.test") && out.contains("STATUS 200"), "{out}{err}");
}
