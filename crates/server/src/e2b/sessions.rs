//! The facade's in-memory sessions: each facade sandbox's access token (256 random bits, handed out by create and
//! connect), owner and E2B template name, and what its processes were started with (envs, cwd, tag), which the
//! runtime does not keep. Nothing is persisted: after a server restart `Sandbox.connect` opens a new session. A
//! session ends with its sandbox (`api::sandboxes::destroy_quietly`).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::auth::Tenant;
use crate::e2b::error::E2bError;

/// One facade sandbox's session: its access token, owner and the E2B template it was created from.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// The access token.
    pub(crate) token: String,
    /// The owning tenant.
    pub(crate) tenant: Tenant,
    /// The template name the client asked for (answered back in `templateID`).
    pub(crate) template: String,
}

/// What a started process was given, which the runtime does not keep (answered by `List`, and `tag` selects it).
#[derive(Debug, Clone, Default)]
pub(crate) struct ProcessMeta {
    /// Its sandbox.
    pub(crate) sandbox: String,
    /// Its extra environment.
    pub(crate) envs: std::collections::BTreeMap<String, String>,
    /// Its working directory.
    pub(crate) cwd: Option<String>,
    /// The client's tag.
    pub(crate) tag: Option<String>,
}

/// The sessions of facade sandboxes, by sandbox id, and what their processes were started with, by command id.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    by_sandbox: Mutex<HashMap<String, Session>>,
    processes: Mutex<HashMap<String, ProcessMeta>>,
}

fn random_token() -> Result<String, E2bError> {
    crate::ids::random_hex(32).map_err(|error| E2bError::from(crate::api::error::ApiError::from(error)))
}

impl Sessions {
    /// The session of sandbox `id`, created (with a new token) when it has none. `template` replaces the recorded
    /// one when given.
    pub(crate) fn open(&self, id: &str, tenant: &Tenant, template: Option<&str>) -> Result<Session, E2bError> {
        let mut sessions = self.by_sandbox.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(session) = sessions.get_mut(id) {
            if let Some(template) = template {
                session.template = template.to_owned();
            }
            return Ok(session.clone());
        }
        let session =
            Session { token: random_token()?, tenant: tenant.clone(), template: template.unwrap_or("base").to_owned() };
        sessions.insert(id.to_owned(), session.clone());
        Ok(session)
    }

    /// The session of sandbox `id`, if it has one.
    pub(crate) fn get(&self, id: &str) -> Option<Session> {
        self.by_sandbox.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(id).cloned()
    }

    /// Forgets sandbox `id`'s session and processes (it ended).
    pub(crate) fn close(&self, id: &str) {
        self.by_sandbox.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(id);
        self.processes.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).retain(|_, meta| meta.sandbox != id);
    }

    /// Records what command `command_id` was started with.
    pub(crate) fn started(&self, command_id: &str, meta: ProcessMeta) {
        self.processes.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(command_id.to_owned(), meta);
    }

    /// What command `command_id` was started with.
    pub(crate) fn process(&self, command_id: &str) -> Option<ProcessMeta> {
        self.processes.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(command_id).cloned()
    }

    /// Forgets the processes of sandbox `id` other than `keep` (the runtime's bounded list of its commands).
    pub(crate) fn retain_processes(&self, id: &str, keep: &[&str]) {
        let mut processes = self.processes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        processes.retain(|command, meta| meta.sandbox != id || keep.contains(&command.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn sessions_keep_their_token() -> Result<(), E2bError> {
        let sessions = Sessions::default();
        let tenant = Tenant {
            name: Arc::from("t"),
            quota: crate::store::Quota { max_sandboxes: 1, max_memory_bytes: 1 },
            admin: false,
        };
        let first = sessions.open("sb-1", &tenant, Some("code-interpreter-v1"))?;
        let again = sessions.open("sb-1", &tenant, None)?;
        assert_eq!(first.token, again.token);
        assert_eq!(again.template, "code-interpreter-v1");
        assert_eq!(first.token.len(), 64);
        sessions.close("sb-1");
        assert!(sessions.get("sb-1").is_none());
        Ok(())
    }
}
