//! Templates through the API, over the fake runtime: `GET /v1/templates` lists what the server's template cache
//! holds (any tenant); `DELETE /v1/templates/{name}` is for admin tenants, removes the name at once and the layers
//! once no running sandbox reads them, answers 404 for an unknown name and 409 while a build holds the cache.

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

#[tokio::test]
async fn templates_are_listed_and_an_admin_removes_one_keeping_the_layers_its_sandboxes_read() {
    let root = tempfile::tempdir_in("/var/tmp").unwrap();
    let cache = TemplateCache::open(root.path()).unwrap();
    for (name, layer) in [("alpha-t", "aa"), ("beta-t", "bb")] {
        std::fs::create_dir_all(cache.layer_dir(layer).join("opt")).unwrap();
        cache.put_template(&record(name, layer)).unwrap();
    }
    let mut config = test_config();
    let mut ops = tenant("ops", KEY_OPS, 1, 1 << 30);
    ops.admin = true;
    config.tenants.push(ops);
    config.templates.cache = Some(root.path().into());
    let h = Harness::with_config(config);

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
    assert!(cache.layer_dir("aa").is_dir(), "the running sandbox's layer was removed");
    h.delete("/v1/templates/alpha-t", KEY_OPS).await.assert_error(404, "not_found");
    h.post("/v1/sandboxes", KEY_A, json!({"template": "alpha-t"})).await.assert_error(422, "unprocessable");

    assert_eq!(h.delete(&format!("/v1/sandboxes/{id}"), KEY_A).await.status, StatusCode::NO_CONTENT);
    assert_eq!(h.delete("/v1/templates/beta-t", KEY_OPS).await.status, StatusCode::NO_CONTENT);
    assert!(!cache.layer_dir("aa").exists() && !cache.layer_dir("bb").exists(), "unused layers stay");
    let empty = h.get("/v1/templates", KEY_A).await;
    assert_eq!(empty.json()["templates"], json!([]));
}
