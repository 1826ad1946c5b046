//! The owner's side: starts `sandkasten spawner`, sends requests one at a time, and hands events (an agent exited on
//! its own) to a callback from a reader thread. Blocking: call it from a blocking context (`spawn_blocking`).

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandkasten_types::{GvisorSettings, MicrovmSettings, ResourceUsage, SandboxSpec};

use super::messages::{SpawnerRequest, SpawnerResponse};
use super::transport::{packet_pair, receive, send};
use crate::error::RuntimeError;

/// Something the spawner reports on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpawnerEvent {
    /// A sandbox's agent exited (limit, crash); its host resources are already removed.
    Exited {
        /// Sandbox id.
        id: String,
        /// Why, where the tier could tell (a microVM guest's kernel panic line).
        why: Option<String>,
    },
    /// The spawner itself is gone: every sandbox it held is gone too.
    SpawnerGone,
}

/// A sandbox the spawner created.
#[derive(Debug)]
pub struct SpawnedSandbox {
    /// The agent's host pid.
    pub pid: u32,
    /// The host end of the agent's protocol channel (a connected unix stream socket).
    pub channel: OwnedFd,
    /// The host end of a microVM's egress door channel (the door mux's, bridged to the guest's `sandkasten.door`
    /// port), when it has one.
    pub door: Option<OwnedFd>,
    /// How a microVM's guest started (microvm tier only; `None` after a restore).
    pub vm_boot: Option<crate::VmBoot>,
}

/// A reply with the descriptors attached to it: the agent's channel, then a microVM's egress door.
type Reply = (SpawnerResponse, Option<OwnedFd>, Option<OwnedFd>);

/// How long a starting spawner may take to check the host (and collect what crashed runs left) before it says ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Waits for the spawner's first packet: `Ready`, or why it cannot run here.
fn wait_until_ready(socket: &OwnedFd) -> Result<(), RuntimeError> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut fds = [PollFd::new(socket, PollFlags::IN)];
    let timeout = Timespec { tv_sec: READY_TIMEOUT.as_secs() as i64, tv_nsec: 0 };
    let ready = poll(&mut fds, Some(&timeout)).map_err(|e| RuntimeError::sys("waiting for the spawner", e))?;
    if ready == 0 {
        return Err(RuntimeError::TierFailed(format!("the spawner did not start within {READY_TIMEOUT:?}")));
    }
    match receive::<SpawnerResponse>(socket.as_fd())? {
        Some((SpawnerResponse::Ready, ..)) => Ok(()),
        Some((SpawnerResponse::Unusable { message }, ..)) => Err(RuntimeError::HostUnsupported(message)),
        Some((other, ..)) => Err(RuntimeError::TierFailed(format!("the spawner started with {other:?}"))),
        None => Err(RuntimeError::TierFailed("the spawner exited as it started (see its log above)".to_owned())),
    }
}

/// A connection to a running spawner process.
pub struct SpawnerClient {
    socket: Arc<OwnedFd>,
    replies: Mutex<Receiver<Reply>>,
    child: Mutex<Child>,
}

impl SpawnerClient {
    /// Starts `program spawner --runsc … --gvisor-platform … --microvm JSON` (normally the `sandkasten` binary
    /// itself) and a thread reading its messages.
    pub fn start(
        program: &Path,
        gvisor: &GvisorSettings,
        microvm: &MicrovmSettings,
        on_event: impl Fn(SpawnerEvent) + Send + 'static,
    ) -> Result<SpawnerClient, RuntimeError> {
        let (ours, theirs) = packet_pair()?;
        let child = Command::new(program)
            .arg("spawner")
            .arg("--runsc")
            .arg(&gvisor.runsc)
            .args(["--gvisor-platform", gvisor.platform.name()])
            .arg("--microvm")
            .arg(serde_json::to_string(microvm).map_err(|e| RuntimeError::InvalidInput(e.to_string()))?)
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| RuntimeError::sys("starting the spawner", e))?;
        let socket = Arc::new(ours);
        let mut child = child;
        if let Err(error) = wait_until_ready(&socket) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(error);
        }
        let (reply_tx, reply_rx) = channel::<Reply>();
        let reader_socket = Arc::clone(&socket);
        std::thread::Builder::new()
            .name("sandkasten-spawner-reader".into())
            .spawn(move || {
                loop {
                    match receive::<SpawnerResponse>(reader_socket.as_fd()) {
                        Ok(Some((response, fds))) if response.is_reply() => {
                            let mut fds = fds.into_iter();
                            if reply_tx.send((response, fds.next(), fds.next())).is_err() {
                                break;
                            }
                        }
                        Ok(Some((SpawnerResponse::Exited { id, why }, _))) => {
                            on_event(SpawnerEvent::Exited { id, why });
                        }
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => break,
                    }
                }
                on_event(SpawnerEvent::SpawnerGone);
            })
            .map_err(|e| RuntimeError::sys("starting the spawner reader thread", e))?;
        Ok(SpawnerClient { socket, replies: Mutex::new(reply_rx), child: Mutex::new(child) })
    }

    fn request(&self, request: &SpawnerRequest) -> Result<Reply, RuntimeError> {
        // One request in flight at a time: replies come back in order.
        let replies =
            self.replies.lock().map_err(|_| RuntimeError::sys("spawner lock", std::io::Error::other("poisoned")))?;
        // A spawner that dies before it answers (or cannot be written to) is a failed part, not the caller's or an
        // internal error: the supervisor restarts it.
        let gone = || RuntimeError::TierFailed("the spawner exited before it answered; it is being restarted".into());
        send(self.socket.as_fd(), request, None).map_err(|_| gone())?;
        replies.recv().map_err(|_| gone())
    }

    /// Creates a sandbox.
    pub fn spawn(&self, id: &str, spec: &SandboxSpec) -> Result<SpawnedSandbox, RuntimeError> {
        spawned(self.request(&SpawnerRequest::Spawn { id: id.to_owned(), spec: spec.clone() })?)
    }

    /// Creates a sandbox from the memory snapshot in `dir` (taken of one with the same spec).
    pub fn spawn_from_memory(&self, id: &str, spec: &SandboxSpec, dir: &Path) -> Result<SpawnedSandbox, RuntimeError> {
        let request = SpawnerRequest::SpawnFromMemory { id: id.to_owned(), spec: spec.clone(), dir: dir.to_owned() };
        spawned(self.request(&request)?)
    }

    /// Saves a running sandbox's memory into `dir` (gVisor); it runs on.
    pub fn memory_snapshot(&self, id: &str, dir: &Path) -> Result<(), RuntimeError> {
        match self.request(&SpawnerRequest::MemorySnapshot { id: id.to_owned(), dir: dir.to_owned() })? {
            (SpawnerResponse::Done { .. }, ..) => Ok(()),
            (SpawnerResponse::Failed { invalid_input: true, message, .. }, ..) => {
                Err(RuntimeError::InvalidInput(message))
            }
            (SpawnerResponse::Failed { message, .. }, ..) => Err(RuntimeError::TierFailed(message)),
            (other, ..) => Err(RuntimeError::sys(
                "taking a memory snapshot",
                std::io::Error::other(format!("unexpected reply {other:?}")),
            )),
        }
    }

    /// Pauses (`pause: true`) or resumes a sandbox through its tier; a resume that restored the sandbox (gVisor)
    /// returns its new pid and channel.
    pub fn set_paused(&self, id: &str, pause: bool) -> Result<Option<SpawnedSandbox>, RuntimeError> {
        let request = if pause {
            SpawnerRequest::Pause { id: id.to_owned() }
        } else {
            SpawnerRequest::Resume { id: id.to_owned() }
        };
        match self.request(&request)? {
            (SpawnerResponse::Done { .. }, ..) => Ok(None),
            (SpawnerResponse::Restored { pid, .. }, Some(channel), door) => {
                Ok(Some(SpawnedSandbox { pid, channel, door, vm_boot: None }))
            }
            (SpawnerResponse::Failed { invalid_input: true, message, .. }, ..) => {
                Err(RuntimeError::InvalidInput(message))
            }
            (SpawnerResponse::Failed { message, .. }, ..) => Err(RuntimeError::TierFailed(message)),
            (other, ..) => Err(RuntimeError::sys(
                "pausing or resuming a sandbox",
                std::io::Error::other(format!("unexpected reply {other:?}")),
            )),
        }
    }

    /// Kills and removes a sandbox; returns what it used.
    pub fn destroy(&self, id: &str) -> Result<ResourceUsage, RuntimeError> {
        match self.request(&SpawnerRequest::Destroy { id: id.to_owned() })? {
            (SpawnerResponse::Destroyed { usage, .. }, ..) => Ok(usage),
            (SpawnerResponse::Failed { invalid_input: true, message, .. }, ..) => {
                Err(RuntimeError::InvalidInput(message))
            }
            (SpawnerResponse::Failed { message, .. }, ..) => {
                Err(RuntimeError::sys("destroying a sandbox", std::io::Error::other(message)))
            }
            (other, ..) => Err(RuntimeError::sys(
                "destroying a sandbox",
                std::io::Error::other(format!("unexpected reply {other:?}")),
            )),
        }
    }
}

/// The answer to a `Spawn` or `SpawnFromMemory`.
fn spawned(reply: Reply) -> Result<SpawnedSandbox, RuntimeError> {
    match reply {
        (SpawnerResponse::Spawned { pid, vm_boot, .. }, Some(channel), door) => {
            Ok(SpawnedSandbox { pid, channel, door, vm_boot })
        }
        (SpawnerResponse::Failed { invalid_input: true, message, .. }, ..) => Err(RuntimeError::InvalidInput(message)),
        (SpawnerResponse::Failed { tier_failed: true, message, .. }, ..) => Err(RuntimeError::TierFailed(message)),
        (SpawnerResponse::Failed { message, .. }, ..) => {
            Err(RuntimeError::sys("spawning a sandbox", std::io::Error::other(message)))
        }
        (other, ..) => {
            Err(RuntimeError::sys("spawning a sandbox", std::io::Error::other(format!("unexpected reply {other:?}"))))
        }
    }
}

impl Drop for SpawnerClient {
    /// Closing the control socket makes the spawner destroy every sandbox and exit; wait for that.
    fn drop(&mut self) {
        // The reader thread holds a clone of the socket: shut it down so the spawner sees the end now.
        let _ = rustix::net::shutdown(self.socket.as_fd(), rustix::net::Shutdown::Both);
        if let Ok(mut child) = self.child.lock() {
            let _ = child.wait();
        }
    }
}
