//! `LiveRuntime`: long-lived sandboxes for an async owner. Creation and destruction go through the spawner (a
//! single-threaded helper process); everything else goes straight to each sandbox's agent.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use sandkasten_types::{ResourceUsage, SandboxSpec};

use super::agent_client::AgentClient;
use crate::error::RuntimeError;
use crate::spawner::{SpawnerClient, SpawnerEvent};

type Agents = Arc<Mutex<HashMap<String, Arc<AgentClient>>>>;

/// Long-lived sandboxes of one owner.
pub struct LiveRuntime {
    spawner: Arc<SpawnerClient>,
    agents: Agents,
}

fn lock_poisoned() -> RuntimeError {
    RuntimeError::sys("sandbox table", std::io::Error::other("lock poisoned"))
}

impl LiveRuntime {
    /// Starts the spawner (`program spawner`, normally the running `sandkasten` binary).
    pub fn start(program: &Path) -> Result<LiveRuntime, RuntimeError> {
        let agents: Agents = Arc::default();
        let forget = Arc::clone(&agents);
        let spawner = SpawnerClient::start(program, move |event| {
            if let Ok(mut map) = forget.lock() {
                match event {
                    SpawnerEvent::Exited { id } => {
                        map.remove(&id);
                    }
                    SpawnerEvent::SpawnerGone => map.clear(),
                }
            }
        })?;
        Ok(LiveRuntime { spawner: Arc::new(spawner), agents })
    }

    /// Creates a sandbox under `id`; it is ready for commands when this returns.
    pub async fn create(&self, id: &str, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        let spawner = Arc::clone(&self.spawner);
        let (owned_id, owned_spec) = (id.to_owned(), spec.clone());
        let spawned = tokio::task::spawn_blocking(move || spawner.spawn(&owned_id, &owned_spec))
            .await
            .map_err(|e| RuntimeError::sys("spawner task", std::io::Error::other(e.to_string())))??;
        let client = AgentClient::new(spawned.channel).map_err(|e| RuntimeError::sys("agent channel", e))?;
        self.agents.lock().map_err(|_| lock_poisoned())?.insert(id.to_owned(), Arc::new(client));
        Ok(())
    }

    /// Kills and removes a sandbox; returns what it used.
    pub async fn destroy(&self, id: &str) -> Result<ResourceUsage, RuntimeError> {
        self.agents.lock().map_err(|_| lock_poisoned())?.remove(id);
        let spawner = Arc::clone(&self.spawner);
        let owned_id = id.to_owned();
        tokio::task::spawn_blocking(move || spawner.destroy(&owned_id))
            .await
            .map_err(|e| RuntimeError::sys("spawner task", std::io::Error::other(e.to_string())))?
    }

    /// The agent of a live sandbox.
    pub fn agent(&self, id: &str) -> Option<Arc<AgentClient>> {
        self.agents.lock().ok().and_then(|map| map.get(id).cloned())
    }

    /// Whether the sandbox is alive (its agent has not exited).
    pub fn is_alive(&self, id: &str) -> bool {
        self.agent(id).is_some()
    }
}
