//! The measurements: interleaved per-request latency over new connections, and interleaved bulk downloads,
//! each route in turn, with the order rotated every iteration so machine noise lands on all routes alike.

use std::time::Instant;

use serde_json::{Value, json};

use crate::client::{Client, Result, Route};
use crate::machine::process_cpu_ns;
use crate::upstream::SMALL_BODY;

/// Per-request latencies in microseconds, indexed like [`Route::ALL`].
pub type Samples = [Vec<f64>; 3];

/// `warmup + iterations` rounds; each round GETs `/small` once by every route, in an order rotated by one per
/// round. Returns the timed rounds' latencies (connect to last body byte).
pub async fn latency(client: &mut Client, warmup: usize, iterations: usize) -> Result<Samples> {
    let mut samples: Samples = Default::default();
    for round in 0..warmup + iterations {
        for k in 0..Route::ALL.len() {
            let i = (round + k) % Route::ALL.len();
            let start = Instant::now();
            let len = client.get(Route::ALL[i], "/small").await?;
            let us = start.elapsed().as_secs_f64() * 1e6;
            if len != SMALL_BODY.len() as u64 {
                return Err(format!("{}: /small returned {len} bytes", Route::ALL[i].key()).into());
            }
            if round >= warmup {
                samples[i].push(us);
            }
        }
    }
    Ok(samples)
}

/// One download of `/big`.
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    /// Decimal megabytes (10^6 bytes) per second of body, connect to last byte.
    pub mb_per_s: f64,
    /// Wall time, seconds.
    pub secs: f64,
    /// CPU time of the whole process (client, proxy and upstream threads) during the download, milliseconds.
    pub cpu_ms: f64,
}

/// `rounds` rounds; each downloads `/big` (`bytes` long) once by every route, order rotated per round.
pub async fn throughput(client: &mut Client, bytes: u64, rounds: usize) -> Result<[Vec<Transfer>; 3]> {
    let mut out: [Vec<Transfer>; 3] = Default::default();
    for round in 0..rounds {
        for k in 0..Route::ALL.len() {
            let i = (round + k) % Route::ALL.len();
            let cpu0 = process_cpu_ns();
            let start = Instant::now();
            let len = client.get(Route::ALL[i], "/big").await?;
            let secs = start.elapsed().as_secs_f64();
            let cpu_ms = process_cpu_ns().saturating_sub(cpu0) as f64 / 1e6;
            if len != bytes {
                return Err(format!("{}: /big returned {len} bytes, expected {bytes}", Route::ALL[i].key()).into());
            }
            out[i].push(Transfer { mb_per_s: bytes as f64 / 1e6 / secs, secs, cpu_ms });
        }
    }
    Ok(out)
}

/// Percentile `q` (0..=1) of sorted `v`, interpolating linearly between ranks.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

/// n, min, median, p90, p99, max and mean of `v`, rounded to 0.1.
pub fn summary(v: &[f64]) -> Value {
    let s = sorted(v);
    let r = |x: f64| (x * 10.0).round() / 10.0;
    json!({
        "n": s.len(),
        "min": r(s.first().copied().unwrap_or(f64::NAN)),
        "median": r(percentile(&s, 0.5)),
        "p90": r(percentile(&s, 0.9)),
        "p99": r(percentile(&s, 0.99)),
        "max": r(s.last().copied().unwrap_or(f64::NAN)),
        "mean": r(s.iter().sum::<f64>() / s.len().max(1) as f64),
    })
}

/// The median of `v`.
pub fn median(v: &[f64]) -> f64 {
    percentile(&sorted(v), 0.5)
}
