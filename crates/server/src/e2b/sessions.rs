//! The facade's in-memory sessions: each facade sandbox's access token (256 random bits, handed out by create and
//! connect), owner and E2B template name, and what its processes were started with (envs, cwd, tag), which the
//! runtime does not keep. Nothing is persisted: after a server restart `Sandbox.connect` opens a new session. A
//! session ends with its sandbox (`lifecycle::destroy_quietly`).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::auth::Tenant;
use crate::ids::{IdError, random_hex};

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
    /// It runs on a pseudo-terminal (its output is sent as `pty` data).
    pub(crate) pty: bool,
    /// Order of starting within the server (`started` sets it; give the default).
    pub(crate) order: u64,
}

/// Most processes remembered per sandbox: more than the runtime keeps (16 running and the 16 last ended), so
/// nothing it still knows of is forgotten, yet a sandbox that starts commands forever cannot grow this table.
const MAX_PROCESSES: usize = 64;

/// The sessions of facade sandboxes, by sandbox id, and what their processes were started with, by command id.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    by_sandbox: Mutex<HashMap<String, Session>>,
    /// By sandbox, then by command id.
    processes: Mutex<HashMap<String, HashMap<String, ProcessMeta>>>,
    /// The non-streaming directory watchers.
    pub(crate) watchers: crate::e2b::watchers::Watchers,
    next_order: std::sync::atomic::AtomicU64,
}

fn random_token() -> Result<String, IdError> {
    random_hex(32)
}

impl Sessions {
    /// The session of sandbox `id`, created (with a new token) when it has none. `template` replaces the recorded
    /// one when given.
    pub(crate) fn open(&self, id: &str, tenant: &Tenant, template: Option<&str>) -> Result<Session, IdError> {
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
        self.processes.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(id);
        self.watchers.close_sandbox(id);
    }

    /// Records what command `command_id` was started with.
    pub(crate) fn started(&self, command_id: &str, mut meta: ProcessMeta) {
        meta.order = self.next_order.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut processes = self.processes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mine = processes.entry(meta.sandbox.clone()).or_default();
        mine.insert(command_id.to_owned(), meta);
        if mine.len() > MAX_PROCESSES
            && let Some(oldest) = mine.iter().min_by_key(|(_, m)| m.order).map(|(id, _)| id.clone())
        {
            mine.remove(&oldest);
        }
    }

    /// What command `command_id` of sandbox `id` was started with.
    pub(crate) fn process(&self, id: &str, command_id: &str) -> Option<ProcessMeta> {
        let processes = self.processes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        processes.get(id).and_then(|mine| mine.get(command_id)).cloned()
    }

    /// Forgets the processes of sandbox `id` other than `keep` (the runtime's bounded list of its commands).
    pub(crate) fn retain_processes(&self, id: &str, keep: &[&str]) {
        let mut processes = self.processes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(mine) = processes.get_mut(id) {
            mine.retain(|command, _| keep.contains(&command.as_str()));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_sandbox_that_starts_commands_forever_keeps_only_the_newest_processes() {
        let sessions = Sessions::default();
        for n in 0..MAX_PROCESSES + 10 {
            let meta = ProcessMeta { sandbox: "sb-1".into(), tag: Some(n.to_string()), ..ProcessMeta::default() };
            sessions.started(&format!("cmd-{n}"), meta);
        }
        sessions.started("cmd-other", ProcessMeta { sandbox: "sb-2".into(), ..ProcessMeta::default() });
        assert!(sessions.process("sb-1", "cmd-9").is_none(), "the oldest are forgotten");
        let newest = format!("cmd-{}", MAX_PROCESSES + 9);
        assert!(sessions.process("sb-1", &newest).is_some());
        assert!(sessions.process("sb-1", "cmd-10").is_some(), "exactly the newest {MAX_PROCESSES} are kept");
        assert!(sessions.process("sb-2", "cmd-other").is_some(), "other sandboxes are untouched");
        sessions.close("sb-1");
        assert!(sessions.process("sb-1", &newest).is_none());
    }

    #[test]
    fn sessions_keep_their_token() -> Result<(), IdError> {
        let sessions = Sessions::default();
        let tenant = Tenant {
            name: Arc::from("t"),
            quota: crate::store::Quota {
                max_sandboxes: 1,
                max_memory_bytes: 1,
                max_pids: 1,
                max_output_bytes: 1,
                max_snapshot_bytes: 1,
            },
            admin: false,
            scan: Arc::default(),
            trust: Default::default(),
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
