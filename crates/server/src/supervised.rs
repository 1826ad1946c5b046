//! The server's own background tasks (the expiry sweeper, which also prunes and collects snapshot garbage; the pools'
//! refill; the usage sampler) run supervised: a task that panics or returns is logged and started again (after
//! 250 ms, doubling to 5 s while it keeps failing within a minute), so one bug on a rare path cannot silently stop
//! sandboxes from expiring (and so from giving back what they hold) for the server's lifetime. The egress audit
//! writer owns its queue's receiving end and is not restarted. The spawner, the one helper process, has its own
//! supervisor in the runtime. Aborting the supervising task drops the running one with it.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures::FutureExt;

/// The first delay before a restart.
const FIRST_DELAY: Duration = Duration::from_millis(250);
/// The longest delay between restarts.
const MAX_DELAY: Duration = Duration::from_secs(5);
/// A task that ran at least this long before it ended starts again after `FIRST_DELAY`.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Runs the task `start` makes, again and again: for the server's tasks, which are meant to run until aborted.
pub(crate) async fn supervise<F, Fut>(name: &'static str, mut start: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut delay = FIRST_DELAY;
    loop {
        let started = Instant::now();
        match AssertUnwindSafe(start()).catch_unwind().await {
            Ok(()) => tracing::error!(task = name, "a server task ended; starting it again"),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(task = name, panic = %message, "a server task panicked; starting it again");
            }
        }
        if started.elapsed() >= HEALTHY_RUN {
            delay = FIRST_DELAY;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_DELAY);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_task_that_panics_or_returns_is_started_again_and_an_abort_ends_it() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let task = tokio::spawn(supervise("test", move || {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                match run {
                    0 => panic!("first run fails"),
                    1 => {}
                    _ => std::future::pending::<()>().await,
                }
            }
        }));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3, "a panic and a return are each followed by a new run");
        task.abort();
        assert!(task.await.is_err_and(|e| e.is_cancelled()));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3, "nothing runs after the abort");
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_failing_again_and_again_waits_longer_each_time_up_to_five_seconds() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let task = tokio::spawn(supervise("test", move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async {}
        }));
        // Runs at 0, 0.25, 0.75, 1.75, 3.75, 7.75, 12.75, 17.75 s.
        tokio::time::sleep(Duration::from_millis(18_000)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 8);
        task.abort();
    }
}
