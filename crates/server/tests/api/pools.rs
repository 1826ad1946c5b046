//! Warm pools through the API, over the fake runtime with the refill task running: `GET /v1/pools` shows each pool's
//! class and counts, only an admin tenant may resize one, bad sizes are refused naming the field, a higher `min`
//! refills, a lower `max` destroys the ready members past it, and a miss raises the target. A zygote pool's members get
//! a spare kernel of the zygote's language with the pool's preload, which a create keeps and a run discards. A pool of
//! a built template replaces its members when the template is rebuilt.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::StatusCode;
use sandkasten_server::PoolConfig;
use sandkasten_server::config::ZygoteKind;
use sandkasten_types::{CodeLanguage, Limits};
use serde_json::{Value, json};

use crate::harness::{Harness, KEY_A, tenant, test_config};

const KEY_OPS: &str = "key-of-tenant-ops-0000001";

/// Aborts the refill task when the test ends.
struct Refill(tokio::task::JoinHandle<()>);

impl Drop for Refill {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn pool(name: &str, limits: Limits, min: usize, max: usize) -> PoolConfig {
    PoolConfig { name: Some(name.into()), limits, min, max, ..toml::from_str("").unwrap() }
}

/// Tenants alpha and bravo, admin tenant ops; pool `std` (default limits, 1..3) and `small` (pids 16, 1..2).
fn harness() -> (Harness, Refill) {
    let mut config = test_config();
    let mut ops = tenant("ops", KEY_OPS, 1, 1 << 30);
    ops.admin = true;
    config.tenants.push(ops);
    config.pools =
        vec![pool("std", Limits::default(), 1, 3), pool("small", Limits { pids: 16, ..Limits::default() }, 1, 2)];
    let h = Harness::with_config(config);
    let refill = Refill(tokio::spawn(sandkasten_server::lifecycle::refill::run(h.state.clone())));
    (h, refill)
}

async fn pools(h: &Harness) -> Vec<Value> {
    let reply = h.get("/v1/pools", KEY_A).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()["pools"].as_array().cloned().unwrap_or_default()
}

async fn pool_named(h: &Harness, name: &str) -> Value {
    pools(h).await.into_iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("no pool {name}"))
}

/// Waits (up to 5 s) until pool `name` satisfies `ok`; returns it.
async fn wait_pool(h: &Harness, name: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pool = pool_named(h, name).await;
        if ok(&pool) {
            return pool;
        }
        assert!(Instant::now() < deadline, "pool {name} never got there: {pool}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn resize(h: &Harness, name: &str, key: &str, body: Value) -> crate::harness::Reply {
    let body = Body::from(serde_json::to_vec(&body).unwrap());
    h.call("PUT", &format!("/v1/pools/{name}"), Some(key), body).await
}

#[tokio::test]
async fn pools_are_listed_with_their_class_sizes_and_counts() {
    let (h, _refill) = harness();
    let std = wait_pool(&h, "std", |p| p["ready"] == 1).await;
    assert_eq!((std["min"].as_u64(), std["max"].as_u64(), std["target"].as_u64()), (Some(1), Some(3), Some(1)));
    assert_eq!(std["template"], "host");
    assert_eq!(std["limits"]["pids"], Limits::default().pids);
    assert_eq!((std["hits"].as_u64(), std["misses"].as_u64(), std["creating"].as_u64()), (Some(0), Some(0), Some(0)));
    assert!(std.get("zygote").is_none(), "{std}");
    let small = wait_pool(&h, "small", |p| p["ready"] == 1).await;
    assert_eq!(small["limits"]["pids"], 16);
    let names: Vec<Value> = pools(&h).await.iter().map(|p| p["name"].clone()).collect();
    assert_eq!(names, [json!("std"), json!("small")], "config order");

    h.create(KEY_A, json!({"limits": {"pids": 16}})).await;
    let small = pool_named(&h, "small").await;
    assert_eq!((small["hits"].as_u64(), small["misses"].as_u64()), (Some(1), Some(0)), "{small}");
    assert_eq!(pool_named(&h, "std").await["hits"], 0, "a claim counts for its own pool only");
    h.call("GET", "/v1/pools", None, Body::empty()).await.assert_error(401, "unauthorized");
}

#[tokio::test]
async fn only_an_admin_tenant_may_resize_a_pool() {
    let (h, _refill) = harness();
    wait_pool(&h, "std", |p| p["ready"] == 1).await;
    let message = resize(&h, "std", KEY_A, json!({"min": 3, "max": 3})).await.assert_error(403, "forbidden");
    assert!(message.contains("admin") && message.contains("alpha"), "{message}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let std = pool_named(&h, "std").await;
    assert_eq!((std["min"].as_u64(), std["max"].as_u64(), std["ready"].as_u64()), (Some(1), Some(3), Some(1)));
    let reply = resize(&h, "std", KEY_OPS, json!({"min": 2, "max": 3})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!((reply.json()["min"].as_u64(), reply.json()["name"].as_str()), (Some(2), Some("std")));
}

#[tokio::test]
async fn bad_sizes_are_refused_naming_the_field() {
    let (h, _refill) = harness();
    let message = resize(&h, "std", KEY_OPS, json!({"min": 4, "max": 2})).await.assert_error(400, "bad_request");
    assert!(message.contains("min (4)") && message.contains("max (2)"), "{message}");
    let message = resize(&h, "std", KEY_OPS, json!({"min": 1, "max": 5000})).await.assert_error(400, "bad_request");
    assert!(message.starts_with("max is 5000") && message.contains("1024"), "{message}");
    let message = resize(&h, "std", KEY_OPS, json!({"min": 1})).await.assert_error(422, "unprocessable");
    assert!(message.contains("max"), "{message}");
    let message = resize(&h, "std", KEY_OPS, json!({"min": -1, "max": 2})).await.assert_error(422, "unprocessable");
    assert!(message.contains("-1"), "{message}");
    resize(&h, "std", KEY_OPS, json!({"min": 1, "max": 2, "boost": 9})).await.assert_error(422, "unprocessable");
    let message = resize(&h, "nope", KEY_OPS, json!({"min": 1, "max": 2})).await.assert_error(404, "not_found");
    assert!(message.contains("nope"), "{message}");
    let std = pool_named(&h, "std").await;
    assert_eq!((std["min"].as_u64(), std["max"].as_u64()), (Some(1), Some(3)), "nothing changed");
}

#[tokio::test]
async fn a_higher_min_refills_and_a_lower_max_destroys_the_surplus() {
    let (h, _refill) = harness();
    wait_pool(&h, "small", |p| p["ready"] == 1).await;
    let reply = resize(&h, "std", KEY_OPS, json!({"min": 3, "max": 3})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    wait_pool(&h, "std", |p| p["ready"] == 3 && p["creating"] == 0).await;
    let before = h.runtime.ids();
    assert_eq!(before.len(), 4, "3 std + 1 small: {before:?}");

    let reply = resize(&h, "std", KEY_OPS, json!({"min": 0, "max": 1})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!((reply.json()["ready"].as_u64(), reply.json()["target"].as_u64()), (Some(1), Some(0)));
    let after = h.runtime.ids();
    assert_eq!(after.len(), 2, "two ready members destroyed before the answer: {after:?}");
    assert!(after.is_subset(&before));
    // The one left is still handed out (a lower target does not destroy ready members).
    let id = h.create(KEY_A, json!({})).await;
    assert!(before.contains(&id), "the create took the remaining member");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(pool_named(&h, "std").await["ready"], 0, "min 0: not refilled without a miss");
}

#[tokio::test]
async fn a_miss_raises_the_target_and_the_pool_grows_past_min() {
    let (h, _refill) = harness();
    wait_pool(&h, "std", |p| p["ready"] == 1).await;
    let reply = resize(&h, "std", KEY_OPS, json!({"min": 0, "max": 2})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    h.create(KEY_A, json!({})).await;
    h.create(KEY_A, json!({})).await;
    let std = wait_pool(&h, "std", |p| p["ready"] == 1).await;
    assert_eq!((std["hits"].as_u64(), std["misses"].as_u64(), std["target"].as_u64()), (Some(1), Some(1), Some(1)));
    let metrics = h.get("/metrics", KEY_A).await.text();
    assert!(metrics.contains("sandkasten_pool_target{class=\"std\"} 1"), "{metrics}");
    assert!(metrics.contains("sandkasten_pool_size{class=\"std\"} 1"), "{metrics}");
}

#[tokio::test]
async fn zygote_members_get_a_spare_kernel_that_a_create_keeps_and_a_run_discards() {
    let mut config = test_config();
    let mut node = pool("node", Limits::default(), 1, 1);
    node.zygote = Some(ZygoteKind::Node);
    node.preload = vec!["fs".into()];
    config.pools = vec![node];
    let h = Harness::with_config(config);
    let _refill = Refill(tokio::spawn(sandkasten_server::lifecycle::refill::run(h.state.clone())));
    wait_pool(&h, "node", |p| p["ready"] == 1).await;
    let member = h.runtime.ids().into_iter().next().unwrap();
    let spare = h.runtime.spares.lock().unwrap().get(&member).cloned();
    assert_eq!(spare, Some((CodeLanguage::Javascript, vec!["fs".to_owned()])), "the zygote's language and preload");

    let created = h.create(KEY_A, json!({})).await;
    assert_eq!(created, member, "the create took the pool member");
    assert!(h.runtime.spares.lock().unwrap().contains_key(&created), "a plain create keeps the spare for its contexts");

    wait_pool(&h, "node", |p| p["ready"] == 1).await;
    let next = h.runtime.ids().into_iter().find(|id| *id != created).unwrap();
    assert!(h.runtime.spares.lock().unwrap().contains_key(&next));
    let reply = h.post("/v1/run", KEY_A, json!({"language": "python", "code": "print(1)"})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["sandbox_id"], next.as_str(), "the run took the pool member");
    assert_eq!(*h.runtime.discarded.lock().unwrap(), vec![next], "a run discards the spare, a create did not");
}

#[tokio::test]
async fn refused_creates_neither_count_nor_make_a_pool_grow() {
    let (h, _refill) = harness();
    wait_pool(&h, "std", |p| p["ready"] == 1).await;
    // Tenant ops may run one sandbox: the first create is a hit, the next ones are refused by its quota.
    h.create(KEY_OPS, json!({})).await;
    wait_pool(&h, "std", |p| p["ready"] == 1).await;
    for _ in 0..5 {
        let reply = h.post("/v1/sandboxes", KEY_OPS, json!({})).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{}", reply.text());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let std = pool_named(&h, "std").await;
    let counts = (std["hits"].as_u64(), std["misses"].as_u64(), std["target"].as_u64(), std["ready"].as_u64());
    assert_eq!(counts, (Some(1), Some(0), Some(1), Some(1)), "{std}");
}

/// A pool of a built template follows its rebuilds: once the template names other layers, the pool's ready member
/// of the old build is destroyed and a new one made, which a create naming the template takes (a hit).
#[tokio::test]
async fn a_pool_replaces_its_members_when_its_template_is_rebuilt() {
    let root = tempfile::tempdir_in("/var/tmp").unwrap();
    let cache = sandkasten_template::TemplateCache::open(root.path()).unwrap();
    let record = |layer: &str| sandkasten_template::TemplateRecord {
        name: "rebuilt-t".into(),
        digest: format!("sha256:{layer}"),
        base: "host".into(),
        root: sandkasten_template::Base::Host,
        layers: vec![layer.into()],
        env: Default::default(),
        workdir: None,
        user: "sandbox".into(),
        preload: Vec::new(),
        size_bytes: 1,
        created: 1,
    };
    let (first, second) = ("1".repeat(64), "2".repeat(64));
    for layer in [&first, &second] {
        std::fs::create_dir_all(cache.layer_dir(layer).join("opt")).unwrap();
    }
    cache.put_template(&record(&first)).unwrap();
    let mut config = test_config();
    config.templates.cache = Some(root.path().into());
    config.pools = vec![PoolConfig { template: "rebuilt-t".into(), ..pool("built", Limits::default(), 1, 1) }];
    let h = Harness::with_config(config);
    let _refill = Refill(tokio::spawn(sandkasten_server::lifecycle::refill::run(h.state.clone())));
    wait_pool(&h, "built", |p| p["ready"] == 1).await;
    let old = h.runtime.ids();
    assert_eq!(old.len(), 1, "{old:?}");

    cache.put_template(&record(&second)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = h.runtime.ids();
        if now.len() == 1 && now.is_disjoint(&old) && pool_named(&h, "built").await["ready"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the pool kept its old member: {old:?} → {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.create(KEY_A, json!({"template": "rebuilt-t"})).await;
    let built = pool_named(&h, "built").await;
    assert_eq!((built["hits"].as_u64(), built["misses"].as_u64()), (Some(1), Some(0)), "{built}");
}
