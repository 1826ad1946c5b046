//! A command run in a long-lived sandbox (the server's exec API, and the host → agent protocol): argv or a shell
//! string, environment, working directory, stdin, timeout, foreground or background.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::limits::LimitKind;
use crate::result::{PhaseTimings, ResourceUsage};

/// One command for a long-lived sandbox. Exactly one of `argv` and `cmd` is set.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandSpec {
    /// Program and arguments, looked up on the sandbox's PATH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// A shell command line, run with `/bin/bash -c` (or `/bin/sh -c` where bash is missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    /// Extra environment variables for this command (on top of the sandbox's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox; default `/workspace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Bytes written to the command's stdin, which is then closed. Default: empty stdin (or open, for background
    /// commands that are sent stdin later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Wall-clock limit for this command, in milliseconds; the command's process group is killed when it runs out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Who runs it inside the sandbox. Default: the sandbox user (uid 1000).
    #[serde(default, skip_serializing_if = "CommandUser::is_sandbox")]
    pub user: CommandUser,
    /// Run it on a new pseudo-terminal of this size instead of pipes: it is the session leader with the terminal as
    /// its controlling terminal and its stdin, stdout and stderr, and everything it writes arrives as stdout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
}

/// The size of a pseudo-terminal, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    /// Columns (1..=1000 through the API).
    pub cols: u16,
    /// Rows (1..=1000 through the API).
    pub rows: u16,
}

impl PtySize {
    /// The most columns or rows the API accepts.
    pub const MAX: u16 = 1000;

    /// Why this size is refused by the API (each side 1..=`MAX`), if it is.
    pub fn invalid_reason(&self) -> Option<String> {
        let max = Self::MAX;
        let bad = |n: u16| !(1..=max).contains(&n);
        (bad(self.cols) || bad(self.rows)).then(|| {
            format!("pty cols and rows must each be between 1 and {max}, got {} cols and {} rows", self.cols, self.rows)
        })
    }
}

/// The user a command runs as, inside the sandbox's user namespace. Either way the command holds no capability and
/// runs under `no_new_privs`, seccomp and landlock: the sandbox's root is uid 0 only inside, an unprivileged uid on
/// the host, and owns nothing there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CommandUser {
    /// The sandbox user, uid and gid 1000.
    #[default]
    Sandbox,
    /// The sandbox's root, uid and gid 0 (without capabilities).
    Root,
}

impl CommandUser {
    /// True for the default, the sandbox user.
    pub fn is_sandbox(&self) -> bool {
        *self == CommandUser::Sandbox
    }
}

impl CommandSpec {
    /// The argv to execute: `argv` as given, or the shell running `cmd`.
    pub fn resolved_argv(&self) -> Result<Vec<String>, String> {
        match (&self.argv, &self.cmd) {
            (Some(argv), None) if !argv.is_empty() && !argv[0].is_empty() => Ok(argv.clone()),
            (None, Some(cmd)) => Ok(vec!["/bin/bash".into(), "-c".into(), cmd.clone()]),
            (Some(_), Some(_)) => Err("give either argv or cmd, not both".into()),
            _ => Err("give the command as argv (a non-empty list) or cmd (a shell string)".into()),
        }
    }
}

/// How a command ended: its exit code or signal, which limit fired, what the sandbox used and the phases. Every exec
/// answer of the server carries these fields as they are (flattened).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommandExit {
    /// Exit code when it exited normally.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub exit_code: Option<i32>,
    /// Signal number when a signal killed it.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub signal: Option<i32>,
    /// True when its timeout killed it.
    #[serde(default)]
    pub timed_out: bool,
    /// True when the kernel's OOM killer killed a process of the sandbox while the command ran (its memory limit).
    #[serde(default)]
    pub oom_killed: bool,
    /// Which limit ended or hampered the command (`time`, `memory`, `pids`, `disk`, `output`), when one did.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub limit: Option<LimitKind>,
    /// What the sandbox used while the command ran: CPU time of every process of the sandbox in that time, and the
    /// sandbox's memory peak so far.
    #[serde(default)]
    pub usage: ResourceUsage,
    /// When its phases ended, in milliseconds from when the host got the request (set by the host; the agent sends
    /// zeros). For a command in a sandbox that already existed `allocate` and `filesystem_ready` are 0.
    #[serde(default)]
    pub phases: PhaseTimings,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_user_is_the_default_and_is_not_sent() -> Result<(), serde_json::Error> {
        let spec = CommandSpec { argv: Some(vec!["id".into()]), ..CommandSpec::default() };
        assert_eq!(serde_json::to_value(&spec)?, serde_json::json!({"argv": ["id"], "env": {}}));
        let root = CommandSpec { user: CommandUser::Root, ..spec };
        let json = serde_json::to_value(&root)?;
        assert_eq!(json["user"], "root");
        assert_eq!(serde_json::from_value::<CommandSpec>(json)?.user, CommandUser::Root);
        Ok(())
    }

    #[test]
    fn exactly_one_of_argv_and_cmd() {
        let argv = CommandSpec { argv: Some(vec!["ls".into()]), ..CommandSpec::default() };
        assert_eq!(argv.resolved_argv(), Ok(vec!["ls".to_owned()]));
        let shell = CommandSpec { cmd: Some("echo hi".into()), ..CommandSpec::default() };
        assert_eq!(shell.resolved_argv().map(|a| a.len()), Ok(3));
        assert!(CommandSpec::default().resolved_argv().is_err());
        assert!(CommandSpec { argv: Some(vec![]), ..CommandSpec::default() }.resolved_argv().is_err());
        let both = CommandSpec { argv: Some(vec!["ls".into()]), cmd: Some("ls".into()), ..CommandSpec::default() };
        assert!(both.resolved_argv().is_err());
    }
}
