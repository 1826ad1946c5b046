//! Request and response bodies of background commands (`POST …/exec` with `background: true` and
//! `/v1/sandboxes/{id}/commands/…`), with their OpenAPI schemas.

use sandkasten_types::{CommandExit, CommandStatus};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::schemas::with_output_limit;
use crate::clock::rfc3339;
use sandkasten_types::Isolation;

/// `POST /v1/sandboxes/{id}/exec` with `background: true` → 202.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BackgroundStarted {
    /// The command's id (`cmd-` + 16 hex digits), for `/v1/sandboxes/{id}/commands/{command_id}/…`.
    #[schema(example = "cmd-5f0c3a9d1e2b4c6f")]
    pub command_id: String,
    /// Its pid inside the sandbox (also its process group).
    pub pid: u32,
    /// Start time (RFC 3339, UTC).
    pub started_at: String,
}

/// Where a background command is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CommandStateName {
    /// Still running.
    Running,
    /// Ended (see `exit_code`, `signal`, `timed_out`).
    Exited,
}

/// A background command.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CommandBody {
    /// Id, `cmd-` + 16 hex digits.
    pub id: String,
    /// The isolation of the sandbox it runs in: its tier, why, and (microVM) `accel`.
    pub isolation: Isolation,
    /// What it runs.
    pub argv: Vec<String>,
    /// Its pid inside the sandbox.
    pub pid: u32,
    /// State.
    pub state: CommandStateName,
    /// How it ended (all empty while it runs): exit code or signal, `timed_out`, `oom_killed`, which `limit` fired,
    /// `usage`, `phases`.
    #[serde(flatten)]
    pub exit: CommandExit,
    /// True when stdout went past the sandbox's output limit (only the first part is retained).
    pub stdout_truncated: bool,
    /// True when stderr went past the sandbox's output limit.
    pub stderr_truncated: bool,
    /// Start time (RFC 3339, UTC).
    pub started_at: String,
    /// End time (RFC 3339, UTC), once it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
}

impl CommandBody {
    /// The body of a command that runs (or ran) in a sandbox on tier `isolation`.
    pub(crate) fn new(status: CommandStatus, isolation: Isolation) -> Self {
        let truncated = status.stdout_truncated || status.stderr_truncated;
        let exit = with_output_limit(status.exit.unwrap_or_default(), truncated);
        CommandBody {
            id: status.id,
            isolation,
            argv: status.argv,
            pid: status.pid,
            state: if status.ended_ms.is_some() { CommandStateName::Exited } else { CommandStateName::Running },
            exit,
            stdout_truncated: status.stdout_truncated,
            stderr_truncated: status.stderr_truncated,
            started_at: rfc3339(status.started_ms),
            ended_at: status.ended_ms.map(rfc3339),
        }
    }
}

/// `GET /v1/sandboxes/{id}/commands`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CommandList {
    /// Running and recently ended background commands, oldest first (at most 16 ended ones are kept).
    pub commands: Vec<CommandBody>,
}

/// `POST /v1/sandboxes/{id}/commands/{command_id}/stdin`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StdinBody {
    /// Text written to the command's stdin.
    #[serde(default)]
    pub data: String,
    /// Close stdin after writing `data` (the program then reads end-of-file).
    #[serde(default)]
    pub eof: bool,
}

/// A signal: a name (`SIGTERM`, `SIGINT`, `SIGKILL`, `SIGHUP`, `SIGQUIT`, `SIGUSR1`, `SIGUSR2`, `SIGCONT`,
/// `SIGSTOP`; the `SIG` prefix may be left out) or a number from 1 to 31.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum SignalValue {
    /// A number from 1 to 31.
    Number(i64),
    /// A name.
    Name(String),
}

/// `POST /v1/sandboxes/{id}/commands/{command_id}/signal`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalBody {
    /// The signal, sent to the command's process group.
    #[schema(example = "SIGTERM")]
    pub signal: SignalValue,
}

/// `?since=` of `GET …/commands/{command_id}/stream`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// Byte offset to continue from (an event's `id`); default 0, the start of the retained output. A
    /// `Last-Event-ID` header takes precedence.
    pub since: Option<u64>,
}

/// The signal number of a name or number; the message says what is accepted.
pub(crate) fn signal_number(value: &SignalValue) -> Result<i32, String> {
    const NAMES: [(&str, i32); 9] = [
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("KILL", 9),
        ("USR1", 10),
        ("USR2", 12),
        ("TERM", 15),
        ("CONT", 18),
        ("STOP", 19),
    ];
    let accepted =
        "use SIGTERM, SIGINT, SIGKILL, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT, SIGSTOP or a number from 1 to 31";
    match value {
        SignalValue::Number(n) if (1..=31).contains(n) => Ok(*n as i32),
        SignalValue::Number(n) => Err(format!("signal {n} is out of range: {accepted}")),
        SignalValue::Name(name) => {
            let upper = name.to_ascii_uppercase();
            let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
            NAMES
                .iter()
                .find(|(known, _)| *known == bare)
                .map(|(_, number)| *number)
                .ok_or_else(|| format!("unknown signal {name:?}: {accepted}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_and_number() {
        let name = |n: &str| signal_number(&SignalValue::Name(n.into()));
        assert_eq!(name("SIGTERM"), Ok(15));
        assert_eq!(name("kill"), Ok(9));
        assert_eq!(name("SIGUSR2"), Ok(12));
        assert!(name("SIGFOO").is_err());
        assert_eq!(signal_number(&SignalValue::Number(2)), Ok(2));
        assert!(signal_number(&SignalValue::Number(0)).is_err());
        assert!(signal_number(&SignalValue::Number(64)).is_err());
    }

    #[test]
    fn statuses_become_bodies() -> Result<(), serde_json::Error> {
        let status = CommandStatus {
            id: "cmd-1".into(),
            argv: vec!["sleep".into()],
            pid: 7,
            started_ms: 0,
            ended_ms: Some(1000),
            exit: Some(sandkasten_types::CommandExit {
                exit_code: None,
                signal: Some(15),
                ..sandkasten_types::CommandExit::default()
            }),
            stdout_truncated: false,
            stderr_truncated: true,
        };
        let body = serde_json::to_value(CommandBody::new(
            status,
            Isolation::new(sandkasten_types::Tier::Gvisor, "requested"),
        ))?;
        assert_eq!(body["isolation"]["tier"], "gvisor");
        assert_eq!(body["state"], "exited");
        assert_eq!(body["signal"], 15);
        assert_eq!(body["exit_code"], serde_json::Value::Null);
        assert_eq!(body["ended_at"], "1970-01-01T00:00:01.000Z");
        Ok(())
    }
}
