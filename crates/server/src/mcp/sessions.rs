//! Which tenant owns each MCP session, and which sandboxes each session created: a session is bound to the tenant
//! whose key opened it (another key naming it is answered as for an unknown session), and when it ends its
//! sandboxes are killed unless they were created with `persist: true` (`ending`). State only: it depends on
//! nothing of the lifecycle (the state holds it).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::auth::Tenant;

/// The session id rmcp hands out (`Mcp-Session-Id`).
pub(crate) type SessionId = Arc<str>;

/// One open session.
#[derive(Debug)]
struct Session {
    tenant: Tenant,
    /// Sandbox id → whether it outlives the session (`persist`).
    sandboxes: BTreeMap<String, bool>,
    /// Session sandbox name → sandbox id (`run_code`/`exec` with `sandbox: "NAME"`).
    named: BTreeMap<String, String>,
}

/// The open MCP sessions of the server.
#[derive(Debug, Default)]
pub(crate) struct McpSessions {
    sessions: Mutex<HashMap<SessionId, Session>>,
    /// Cancelled when the server begins to stop: every session and its streams end (an open SSE stream would
    /// otherwise hold the graceful shutdown forever).
    stopping: tokio_util::sync::CancellationToken,
}

/// What a session that ended leaves to do: kill these sandboxes as this tenant.
#[derive(Debug)]
pub(crate) struct Leftovers {
    /// The session's tenant.
    pub(crate) tenant: Tenant,
    /// Its sandboxes not created with `persist`.
    pub(crate) sandboxes: Vec<String>,
}

impl McpSessions {
    fn lock(&self) -> MutexGuard<'_, HashMap<SessionId, Session>> {
        // A panic while holding the lock cannot leave the map half-updated (each update is one insert or remove).
        self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Cancelled when the server begins to stop.
    pub(crate) fn stopping(&self) -> &tokio_util::sync::CancellationToken {
        &self.stopping
    }

    /// Sessions `tenant` has open.
    pub(crate) fn count(&self, tenant: &str) -> usize {
        self.lock().values().filter(|session| &*session.tenant.name == tenant).count()
    }

    /// Records a new session of `tenant`.
    pub(crate) fn open(&self, id: SessionId, tenant: Tenant) {
        let session = Session { tenant, sandboxes: BTreeMap::new(), named: BTreeMap::new() };
        self.lock().insert(id, session);
    }

    /// The tenant that opened session `id`, if it is open.
    pub(crate) fn owner(&self, id: &str) -> Option<Arc<str>> {
        self.lock().get(id).map(|session| Arc::clone(&session.tenant.name))
    }

    /// Records that session `id` created `sandbox` (under `name`, when given); `persist` keeps it past the session.
    /// False when the session has already ended (then the caller must not leave the sandbox behind).
    pub(crate) fn adopt(&self, id: &str, sandbox: &str, persist: bool, name: Option<&str>) -> bool {
        let mut sessions = self.lock();
        let Some(session) = sessions.get_mut(id) else { return false };
        session.sandboxes.insert(sandbox.to_owned(), persist);
        if let Some(name) = name {
            session.named.insert(name.to_owned(), sandbox.to_owned());
        }
        true
    }

    /// The sandbox session `id` created under `name`.
    pub(crate) fn named(&self, id: &str, name: &str) -> Option<String> {
        self.lock().get(id)?.named.get(name).cloned()
    }

    /// Forgets `sandbox` (killed through `kill_sandbox`) in session `id`.
    pub(crate) fn forget(&self, id: &str, sandbox: &str) {
        if let Some(session) = self.lock().get_mut(id) {
            session.sandboxes.remove(sandbox);
            session.named.retain(|_, named| named != sandbox);
        }
    }

    /// Ends session `id`: forgets it and answers the sandboxes to kill (none when it was not open).
    pub(crate) fn close(&self, id: &str) -> Option<Leftovers> {
        let session = self.lock().remove(id)?;
        Some(leftovers(session))
    }

    /// Ends every session (the server is stopping).
    pub(crate) fn close_all(&self) -> Vec<Leftovers> {
        self.lock().drain().map(|(_, session)| leftovers(session)).collect()
    }
}

fn leftovers(session: Session) -> Leftovers {
    let sandboxes = session.sandboxes.into_iter().filter(|(_, persist)| !persist).map(|(id, _)| id).collect();
    Leftovers { tenant: session.tenant, sandboxes }
}
