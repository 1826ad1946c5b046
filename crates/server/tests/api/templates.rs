//! Templates through the API, over the fake runtime: `GET /v1/templates` lists what the server's template cache
//! holds (any tenant); `DELETE /v1/templates/{name}` is for admin tenants, removes the name at once and the layers
//! once no running or paused sandbox and no pool reads them, answers 404 for an unknown name and 409 while a build
//! holds the cache or when a pool names the template.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use sandkasten_template::{TemplateCache, TemplateRecord};
use serde_json::json;

use crate::harness::{Harness, KEY_A, tenant, test_config};

const KEY_OPS: &str = "key-of-tenant-ops-0000001";

fn record(name: &str, layer: &str) -> TemplateRecord {
    TemplateRecord {
        name: name.into(),
        digest: format!("sha256:{layer}"),
        base: "host".into(),
        root: sandkasten_template::Base::Host,
        layers: vec![layer.into()],
        env: BTreeMap::new(),
        workdir: Some("/opt/app".into()),
        user: "sandbox".into(),
        preload: vec!["json".into()],
        size_bytes: 3,
        created: 1,
    }
}

/// A harness whose config adds the admin tenant `ops` and reads templates from `cache`.
fn with_admin_and_cache(cache: &std::path::Path) -> Harness {
    let mut config = test_config();
    let mut ops = tenant("ops", KEY_OPS, 1, 1 << 30);
    ops.admin = true;
    config.tenants.push(ops);
    config.templates.cache = Some(cache.into());
    Harness::with_config(config)
}

#[tokio::test]
async fn templates_are_listed_and_an_admin_removes_one_keeping_the_layers_its_sandboxes_read() {
    let root = tempfile::tempdir_in("/var/tmp").unwrap();
    let cache = TemplateCache::open(root.path()).unwrap();
    let (aa, bb) = ("a".repeat(64), "b".repeat(64));
    for (name, layer) in [("alpha-t", aa.as_str()), ("beta-t", bb.as_str())] {
        std::fs::create_dir_all(cache.layer_dir(layer).join("opt")).unwrap();
        cache.put_template(&record(name, layer)).unwrap();
    }
    let h = with_admin_and_cache(root.path());

    let listed = h.get("/v1/templates", KEY_A).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text());
    let templates = listed.json()["templates"].clone();
    assert_eq!(templates[0]["name"], "alpha-t", "{templates}");
    assert_eq!(templates[1]["name"], "beta-t", "{templates}");
    assert_eq!(templates[0]["layers"], 1);
    assert_eq!(templates[0]["workdir"], "/opt/app");
    assert_eq!(templates[0]["preload"], json!(["json"]));

    let id = h.create(KEY_A, json!({"template": "alpha-t"})).await;
    let refused = h.delete("/v1/templates/alpha-t", KEY_A).await;
    refused.assert_error(403, "forbidden");
    assert!(refused.text().contains("admin"), "{}", refused.text());

    {
        let _build = cache.lock().unwrap();
        h.delete("/v1/templates/alpha-t", KEY_OPS).await.assert_error(409, "conflict");
    }
    assert_eq!(h.delete("/v1/templates/alpha-t", KEY_OPS).await.status, StatusCode::NO_CONTENT);
    let names: Vec<_> = h.get("/v1/templates", KEY_A).await.json()["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].clone())
        .collect();
    assert_eq!(names, [json!("beta-t")]);
    assert!(cache.layer_dir(&aa).is_dir(), "the running sandbox's layer was removed");
    h.delete("/v1/templates/alpha-t", KEY_OPS).await.assert_error(404, "not_found");
    h.post("/v1/sandboxes", KEY_A, json!({"template": "alpha-t"})).await.assert_error(422, "unprocessable");

    assert_eq!(h.delete(&format!("/v1/sandboxes/{id}"), KEY_A).await.status, StatusCode::NO_CONTENT);
    assert_eq!(h.delete("/v1/templates/beta-t", KEY_OPS).await.status, StatusCode::NO_CONTENT);
    assert!(!cache.layer_dir(&aa).exists() && !cache.layer_dir(&bb).exists(), "unused layers stay");
    let empty = h.get("/v1/templates", KEY_A).await;
    assert_eq!(empty.json()["templates"], json!([]));
}

/// A template a pool names is not removed (409 naming the pool: the next start would refuse the config); the layers a
/// pool's members are made of stay while the pool names them, even once its template was rebuilt and a removal of
/// another template collects what no template uses; a paused sandbox's layers stay through its template's removal;
/// once nothing names a layer, the next removal collects it.
#[tokio::test]
async fn layers_a_pool_or_a_paused_sandbox_reads_stay_and_a_pools_template_is_not_removed() {
    let root = tempfile::tempdir_in("/var/tmp").unwrap();
    let cache = TemplateCache::open(root.path()).unwrap();
    let (pooled, rebuilt, paused, other) = ("c".repeat(64), "f".repeat(64), "d".repeat(64), "e".repeat(64));
    for layer in [&pooled, &rebuilt, &paused, &other] {
        std::fs::create_dir_all(cache.layer_dir(layer).join("opt")).unwrap();
    }
    for (name, layer) in [("pooled-t", &pooled), ("paused-t", &paused), ("other-t", &other)] {
        cache.put_template(&record(name, layer)).unwrap();
    }
    let mut config = test_config();
    let mut ops = tenant("ops", KEY_OPS, 1, 1 << 30);
    ops.admin = true;
    config.tenants.push(ops);
    config.templates.cache = Some(root.path().into());
    config.pools = vec![toml::from_str("name = \"warm\"\ntemplate = \"pooled-t\"\nmin = 1\nmax = 1\n").unwrap()];
    let h = Harness::with_config(config);

    let refused = h.delete("/v1/templates/pooled-t", KEY_OPS).await.assert_error(409, "conflict");
    assert!(refused.contains("pool \"warm\""), "{refused}");
    let id = h.create(KEY_A, json!({"template": "paused-t"})).await;
    assert_eq!(h.post(&format!("/v1/sandboxes/{id}/pause"), KEY_A, json!({})).await.status, StatusCode::OK);
    assert_eq!(h.delete("/v1/templates/paused-t", KEY_OPS).await.status, StatusCode::NO_CONTENT);
    assert!(cache.layer_dir(&paused).is_dir(), "the paused sandbox's layer was removed");
    // The pool's template is rebuilt (no refill task runs here: the pool still makes its members of the old build).
    cache.put_template(&record("pooled-t", &rebuilt)).unwrap();
    assert_eq!(h.delete("/v1/templates/other-t", KEY_OPS).await.status, StatusCode::NO_CONTENT);
    assert!(cache.layer_dir(&pooled).is_dir(), "the pool's layer was removed");
    assert!(cache.layer_dir(&paused).is_dir(), "the paused sandbox's layer was removed");
    assert!(!cache.layer_dir(&other).exists(), "a layer nothing names stays");

    let resumed = h.post(&format!("/v1/sandboxes/{id}/resume"), KEY_A, json!({})).await;
    assert_eq!(resumed.status, StatusCode::OK, "{}", resumed.text());
    assert_eq!(h.delete(&format!("/v1/sandboxes/{id}"), KEY_A).await.status, StatusCode::NO_CONTENT);
    let spare = "9".repeat(64);
    std::fs::create_dir_all(cache.layer_dir(&spare).join("opt")).unwrap();
    cache.put_template(&record("spare-t", &spare)).unwrap();
    assert_eq!(h.delete("/v1/templates/spare-t", KEY_OPS).await.status, StatusCode::NO_CONTENT);
    assert!(!cache.layer_dir(&paused).exists(), "a layer nothing names any more stays");
}

/// `POST /v1/templates` refuses before anything runs: a tenant that is not an admin (403); a spec with an unknown
/// key, a wrong type or no base, a base that is not built, a Dockerfile without a name, a file the spec names but the
/// request lacks or one not in base64 (422, each naming the field); a build while another holds the cache (409).
/// Nothing is made.
#[tokio::test]
async fn a_template_build_request_is_checked_before_anything_runs() {
    let root = tempfile::tempdir_in("/var/tmp").unwrap();
    let cache = TemplateCache::open(root.path()).unwrap();
    let h = with_admin_and_cache(root.path());
    let good = json!({"spec": "name = \"t\"\nbase = \"host\"\nrun = [\"true\"]\n"});

    let refused = h.post("/v1/templates", KEY_A, good.clone()).await;
    refused.assert_error(403, "forbidden");
    assert!(refused.text().contains("admin = true"), "{}", refused.text());

    for (body, needle) in [
        (json!({"spec": "name = \"t\"\nbase = \"host\"\nrn = [\"x\"]\n"}), "unknown field `rn`"),
        (json!({"spec": {"name": "t", "base": "host", "run": "true"}}), "run: invalid type"),
        (json!({"spec": {"name": "t"}}), "missing field `base`"),
        (json!({"spec": {"name": "t", "base": "never-built"}}), "base: no template named \"never-built\" is built"),
        (json!({"spec": 3}), "spec: give the template.toml text"),
        (json!({}), "nothing to build"),
        (json!({"dockerfile": "FROM host\nRUN true\n"}), "name: required with a dockerfile"),
        (json!({"dockerfile": "FROM host\nEXPOSE 80\n", "name": "d"}), "line 2: EXPOSE is not supported"),
        (
            json!({"spec": {"name": "t", "base": "host", "files": [{"src": "a.py", "dest": "/opt/a.py"}]}}),
            "files[0].src: \"a.py\" is not among the request's files",
        ),
        (
            json!({"spec": {"name": "t", "base": "host", "files": [{"src": "a.py", "dest": "/opt/a.py"}]},
                   "files": {"a.py": "not base64!"}}),
            "files.a.py: not standard base64",
        ),
        (json!({"spec": good["spec"], "surprise": 1}), "unknown field `surprise`"),
    ] {
        let answer = h.post("/v1/templates", KEY_OPS, body.clone()).await;
        answer.assert_error(422, "unprocessable");
        let message = answer.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
        assert!(message.contains(needle), "{body}: {needle}: {message}");
    }
    {
        let _build = cache.lock().unwrap();
        let busy = h.post("/v1/templates", KEY_OPS, good).await;
        busy.assert_error(409, "conflict");
        assert!(busy.text().contains("another template build"), "{}", busy.text());
    }
    assert!(cache.templates().unwrap().is_empty());
}
