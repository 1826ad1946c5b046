//! Egress proxy overhead on loopback (issue #5): per-request latency and bulk throughput of a direct
//! connection against plain-HTTP forwarding and a CONNECT tunnel through [`sandkasten_egress::Proxy`].
//!
//! ```text
//! cargo run --release -p sandkasten-egress --example egress_bench -- --json bench/results/egress.json [--quick] [--workers N]
//! ```
//!
//! One process, three parts: an upstream HTTP/1.1 server on 127.0.0.1 (`upstream`), the proxy serving a
//! loopback listener for one sandbox whose allowlist policy admits `bench.test`, a static `[egress.hosts]`
//! entry pointing at 127.0.0.1 (allowed by `allow_cidrs = ["127.0.0.1/32"]`), both on a multi-threaded tokio
//! runtime like the server's; and a client on its own single-threaded runtime in the main thread (`client`),
//! standing in for the sandboxed program. In production the proxy's listener is inside the sandbox's network
//! namespace, but the code path from accept to upstream connect is the same.

mod client;
mod machine;
mod measure;
mod upstream;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use sandkasten_egress::{AuditEvent, AuditSink, Decision, EgressConfig, Mode, Policy, Proxy, SandboxEgress};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::client::{Client, Result, Route};
use crate::measure::{Transfer, median, summary};

/// The name the proxy resolves (statically) to the upstream.
const NAME: &str = "bench.test";
/// The client's read buffer, bytes (the same for every route).
const READ_BUF: usize = 64 * 1024;
const MIB: u64 = 1024 * 1024;

/// Command-line options.
struct Args {
    json: PathBuf,
    quick: bool,
    /// Worker threads of the proxy's and upstream's runtime; default: one per CPU, like the server's.
    workers: Option<usize>,
}

impl Args {
    fn parse() -> Result<Args> {
        let mut json = None;
        let mut quick = false;
        let mut workers = None;
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--json" => json = Some(PathBuf::from(args.next().ok_or("--json needs a path")?)),
                "--quick" => quick = true,
                "--workers" => workers = Some(args.next().ok_or("--workers needs a number")?.parse()?),
                "-h" | "--help" => {
                    println!("usage: egress_bench --json OUT.json [--quick] [--workers N]");
                    std::process::exit(0);
                }
                other => {
                    return Err(
                        format!("unknown argument {other:?} (usage: --json OUT.json [--quick] [--workers N])").into()
                    );
                }
            }
        }
        Ok(Args { json: json.ok_or("--json OUT.json is required")?, quick, workers })
    }
}

/// Sizes of one run.
struct Params {
    warmup: usize,
    iterations: usize,
    big: u64,
    rounds: usize,
    workers: usize,
}

/// Counts audit events: the server queues each one without blocking, so counting is the comparable cost.
#[derive(Default)]
struct CountingAudit {
    allowed: AtomicU64,
    other: AtomicU64,
}

impl AuditSink for CountingAudit {
    fn record(&self, event: AuditEvent) {
        // An allowed connection is recorded twice (when it opens, and with its bytes when it ends): count the ends.
        if event.open {
            return;
        }
        let counter = if event.decision == Decision::Allowed { &self.allowed } else { &self.other };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

fn main() -> Result<()> {
    let args = Args::parse()?;
    let workers = args.workers.unwrap_or(std::thread::available_parallelism().map(usize::from).unwrap_or(1)).max(1);
    let p = if args.quick {
        Params { warmup: 50, iterations: 500, big: 64 * MIB, rounds: 3, workers }
    } else {
        Params { warmup: 100, iterations: 3000, big: 256 * MIB, rounds: 9, workers }
    };
    eprintln!("egress_bench: sampling the machine for 1 s");
    let machine = machine::describe();
    let load_before = machine::loadavg();
    let started = Instant::now();

    let server = tokio::runtime::Builder::new_multi_thread().worker_threads(p.workers).enable_all().build()?;
    let audit = Arc::new(CountingAudit::default());
    let (upstream, proxy_addr, handle) = server.block_on(start(audit.clone(), p.big))?;

    let client_rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut client = Client::new(upstream, proxy_addr, NAME, READ_BUF);
    eprintln!("egress_bench: latency, {} rounds of 3 requests", p.warmup + p.iterations);
    let lat = client_rt.block_on(measure::latency(&mut client, p.warmup, p.iterations))?;
    eprintln!("egress_bench: throughput, {} rounds of 3 downloads of {} MiB", p.rounds, p.big / MIB);
    let thr = client_rt.block_on(measure::throughput(&mut client, p.big, p.rounds))?;
    server.block_on(handle.shutdown());
    drop(server);

    let proxied = 2 * (p.warmup + p.iterations + p.rounds) as u64;
    let results = json!({
        "machine": machine,
        "loadavg_before": load_before,
        "loadavg_after": machine::loadavg(),
        "elapsed_s": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "params": {
            "quick": args.quick,
            "latency_warmup_rounds": p.warmup,
            "latency_rounds": p.iterations,
            "small_body_bytes": upstream::SMALL_BODY.len(),
            "big_body_bytes": p.big,
            "throughput_rounds": p.rounds,
            "server_runtime_workers": p.workers,
            "client_read_buffer_bytes": READ_BUF,
        },
        "method": method(&p),
        "latency_us": routes(|i| summary(&lat[i])),
        "latency_added": added(&lat),
        "throughput": throughput_json(&thr),
        "audit": {
            "allowed_events": audit.allowed.load(Ordering::Relaxed),
            "other_events": audit.other.load(Ordering::Relaxed),
            "expected_allowed_events": proxied,
        },
    });
    if let Some(dir) = args.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&results)? + "\n")?;
    eprintln!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "latency_added": results["latency_added"],
            "throughput_ratio": results["throughput"]["ratio_vs_direct"],
        }))?
    );
    eprintln!("egress_bench: wrote {}", args.json.display());
    let allowed = audit.allowed.load(Ordering::Relaxed);
    if allowed != proxied {
        return Err(format!("expected {proxied} allowed audit events, got {allowed}").into());
    }
    Ok(())
}

/// Starts the upstream and the proxy on the current (server) runtime.
async fn start(
    audit: Arc<CountingAudit>,
    big: u64,
) -> Result<(SocketAddr, SocketAddr, sandkasten_egress::ProxyHandle)> {
    let loopback = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let upstream_listener = TcpListener::bind(loopback).await?;
    let upstream = upstream_listener.local_addr()?;
    tokio::spawn(upstream::serve(upstream_listener, big));

    let mut config = EgressConfig { allow_cidrs: vec!["127.0.0.1/32".into()], ..Default::default() };
    config.hosts.insert(NAME.into(), vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]);
    let proxy = Proxy::new(config, audit)?;
    let policy = Policy::compile(Mode::Allowlist, &[NAME.to_owned()], &[])?;
    let sandbox = Arc::new(SandboxEgress::new("sb-bench", "bench", policy, None));
    let proxy_listener = TcpListener::bind(loopback).await?;
    let proxy_addr = proxy_listener.local_addr()?;
    let handle = proxy.serve(proxy_listener, sandbox);
    Ok((upstream, proxy_addr, handle))
}

/// `{"direct": f(0), "forward": f(1), "connect": f(2)}`.
fn routes(f: impl Fn(usize) -> Value) -> Value {
    Value::Object(Route::ALL.iter().enumerate().map(|(i, r)| (r.key().to_owned(), f(i))).collect())
}

/// For each proxied route: median minus direct median, the ratio of medians, and the median of the per-round
/// differences (each round has one request of every route, back to back).
fn added(lat: &measure::Samples) -> Value {
    let direct = median(&lat[0]);
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    let mut out = serde_json::Map::new();
    for i in 1..Route::ALL.len() {
        let proxied = median(&lat[i]);
        let paired: Vec<f64> = lat[i].iter().zip(&lat[0]).map(|(p, d)| p - d).collect();
        out.insert(
            Route::ALL[i].key().to_owned(),
            json!({
                "added_median_us": r1(proxied - direct),
                "ratio_median": (proxied / direct * 100.0).round() / 100.0,
                "paired_difference_median_us": r1(median(&paired)),
            }),
        );
    }
    Value::Object(out)
}

fn throughput_json(thr: &[Vec<Transfer>; 3]) -> Value {
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    let mbps = |i: usize| thr[i].iter().map(|t| t.mb_per_s).collect::<Vec<_>>();
    let direct = median(&mbps(0));
    let direct_cpu = median(&thr[0].iter().map(|t| t.cpu_ms).collect::<Vec<_>>());
    let best = |i: usize| mbps(i).into_iter().fold(f64::MIN, f64::max);
    let mut out = serde_json::Map::new();
    for (i, route) in Route::ALL.iter().enumerate() {
        let v = mbps(i);
        let cpu = median(&thr[i].iter().map(|t| t.cpu_ms).collect::<Vec<_>>());
        out.insert(
            route.key().to_owned(),
            json!({
                "mb_per_s_median": r1(median(&v)),
                "mb_per_s_best": r1(best(i)),
                "mb_per_s_runs": v.iter().map(|x| r1(*x)).collect::<Vec<_>>(),
                "seconds_median": (median(&thr[i].iter().map(|t| t.secs).collect::<Vec<_>>()) * 1000.0).round() / 1000.0,
                "cpu_ms_median": r1(cpu),
                "cpu_ratio_vs_direct": (cpu / direct_cpu * 100.0).round() / 100.0,
            }),
        );
    }
    let ratio = |i: usize| (median(&mbps(i)) / direct * 100.0).round() / 100.0;
    let ratio_best = |i: usize| (best(i) / best(0) * 100.0).round() / 100.0;
    out.insert("ratio_vs_direct".into(), json!({ "forward": ratio(1), "connect": ratio(2) }));
    out.insert("ratio_vs_direct_best".into(), json!({ "forward": ratio_best(1), "connect": ratio_best(2) }));
    Value::Object(out)
}

fn method(p: &Params) -> Value {
    json!({
        "setup": format!(
            "a minimal HTTP/1.1 upstream on 127.0.0.1 and sandkasten_egress::Proxy serving a 127.0.0.1 \
             listener for one sandbox (allowlist policy `{NAME}`, static hosts entry {NAME} -> 127.0.0.1, \
             allow_cidrs 127.0.0.1/32, no CA so tunnels are blind, a counting audit sink) on a {}-worker tokio \
             runtime; the client on a single-threaded runtime in the main thread, raw HTTP/1.1 with TCP_NODELAY, \
             reading with a {} KiB buffer until Content-Length is complete",
            p.workers, READ_BUF / 1024),
        "latency": format!(
            "GET /small ({} body bytes), a new TCP connection per request, timed from connect to the last body \
             byte; {} rounds (after {} untimed) of one request per route (direct to the upstream; plain-HTTP \
             forwarding `GET http://{NAME}:port/small` to the proxy; `CONNECT {NAME}:port` then the GET inside), \
             the order rotated by one per round",
            upstream::SMALL_BODY.len(), p.iterations, p.warmup),
        "throughput": format!(
            "GET /big ({} MiB of zeros), one new connection per download, timed from connect to the last body \
             byte; {} rounds of one download per route, order rotated per round; MB/s = 10^6 bytes per second, \
             median and best of the rounds; cpu_ms = CPU time of all the process's threads (client, proxy and \
             upstream) during the download, from /proc/self/task/*/schedstat",
            p.big / MIB, p.rounds),
    })
}
