//! The clock both sides use for phase timestamps: CLOCK_MONOTONIC is shared across pid and user namespaces, so a
//! timestamp taken by the agent can be compared with one taken by the host.

/// Nanoseconds on CLOCK_MONOTONIC.
pub fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (now.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(now.tv_nsec as u64)
}
