//! The spawner, supervised. If the spawner process dies (killed, crashed), every sandbox it held dies with it (their
//! agents have it as parent-death target); the supervisor then reports the runtime unhealthy with the reason, answers
//! creates and destroys with a `TierFailed` error saying so (never a broken pipe), and restarts the spawner with a
//! growing delay (250 ms, doubling, at most 5 s) until one starts. The new spawner removes what the dead one left
//! (its garbage collection at start), and the runtime reports the sandboxes that died as lost.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use sandkasten_types::{GvisorSettings, MicrovmSettings};

use crate::error::RuntimeError;
use crate::spawner::{SpawnerClient, SpawnerEvent};

/// What the runtime does with the spawner's events (its sandbox table).
pub(super) type EventHandler = Arc<dyn Fn(SpawnerEvent) + Send + Sync>;

const FIRST_RETRY: Duration = Duration::from_millis(250);
const LAST_RETRY: Duration = Duration::from_secs(5);

/// The running spawner, or why there is none.
pub(super) struct Supervisor {
    program: PathBuf,
    gvisor: GvisorSettings,
    microvm: MicrovmSettings,
    on_event: EventHandler,
    current: RwLock<Option<Arc<SpawnerClient>>>,
    down: Mutex<Option<String>>,
    /// When the running spawner started, and the delay before the next restart (grows while spawners die young).
    restarts: Mutex<(Instant, Duration)>,
}

/// A spawner that dies sooner than this after its start counts as crash-looping: the next restart waits longer.
const HEALTHY_AFTER: Duration = Duration::from_secs(10);

impl Supervisor {
    /// Starts the spawner; a spawner that cannot start at all is the caller's error (the server does not start).
    pub(super) fn start(
        program: PathBuf,
        gvisor: GvisorSettings,
        microvm: MicrovmSettings,
        on_event: EventHandler,
    ) -> Result<Arc<Supervisor>, RuntimeError> {
        let supervisor = Arc::new(Supervisor {
            program,
            gvisor,
            microvm,
            on_event,
            current: RwLock::new(None),
            down: Mutex::new(None),
            restarts: Mutex::new((Instant::now(), FIRST_RETRY)),
        });
        let client = supervisor.launch()?;
        if let Ok(mut current) = supervisor.current.write() {
            *current = Some(client);
        }
        Ok(supervisor)
    }

    fn launch(self: &Arc<Self>) -> Result<Arc<SpawnerClient>, RuntimeError> {
        let me: Weak<Supervisor> = Arc::downgrade(self);
        let client = SpawnerClient::start(&self.program, &self.gvisor, &self.microvm, move |event| {
            if let Some(supervisor) = me.upgrade() {
                supervisor.event(event);
            }
        })?;
        Ok(Arc::new(client))
    }

    fn event(self: &Arc<Self>, event: SpawnerEvent) {
        let gone = event == SpawnerEvent::SpawnerGone;
        (self.on_event)(event);
        if gone {
            self.went_down();
        }
    }

    /// The spawner is gone: forget it, say so, and restart it from a thread of its own (this runs on the dead
    /// spawner's reader thread, whose end is what wakes requests still waiting for a reply).
    fn went_down(self: &Arc<Self>) {
        let reason = "the spawner exited (its sandboxes are gone); it is being restarted".to_owned();
        tracing::error!("{reason}");
        self.set_down(Some(reason));
        if let Ok(mut current) = self.current.write() {
            current.take();
        }
        let mut delay = FIRST_RETRY;
        if let Ok(mut restarts) = self.restarts.lock() {
            // One that died young is crash-looping: keep growing the delay instead of starting over.
            if restarts.0.elapsed() < HEALTHY_AFTER {
                delay = restarts.1;
            }
            restarts.1 = (delay * 2).min(LAST_RETRY);
        }
        let me = Arc::clone(self);
        let restart = std::thread::Builder::new().name("sandkasten-spawner-restart".into()).spawn(move || {
            loop {
                std::thread::sleep(delay);
                match me.launch() {
                    Ok(client) => {
                        if let Ok(mut current) = me.current.write() {
                            *current = Some(client);
                        }
                        if let Ok(mut restarts) = me.restarts.lock() {
                            restarts.0 = Instant::now();
                        }
                        me.set_down(None);
                        tracing::info!("the spawner was restarted");
                        return;
                    }
                    Err(error) => {
                        me.set_down(Some(format!("the spawner exited and could not be restarted: {error}")));
                        delay = (delay * 2).min(LAST_RETRY);
                    }
                }
            }
        });
        if let Err(error) = restart {
            self.set_down(Some(format!("the spawner exited and no thread could restart it: {error}")));
        }
    }

    fn set_down(&self, reason: Option<String>) {
        if let Ok(mut down) = self.down.lock() {
            *down = reason;
        }
    }

    /// Why the runtime cannot create or destroy sandboxes now (`None`: it can).
    pub(super) fn down(&self) -> Option<String> {
        self.down.lock().ok().and_then(|down| down.clone())
    }

    /// The running spawner, or a `TierFailed` error saying why there is none.
    pub(super) fn client(&self) -> Result<Arc<SpawnerClient>, RuntimeError> {
        let current = self.current.read().ok().and_then(|current| current.clone());
        current.ok_or_else(|| {
            let why = self.down().unwrap_or_else(|| "the spawner is not running".to_owned());
            RuntimeError::TierFailed(format!("{why}: sandboxes cannot be created or destroyed until it runs again"))
        })
    }
}
