//! Request and response bodies of the API, with their OpenAPI schemas. Types of `sandkasten_types` are mirrored here
//! (same JSON shape, plus `ToSchema`) rather than annotated there; tests check each mirror against its original.

use std::collections::BTreeMap;

use sandkasten_scan::{Finding, ScanPolicyOverride};
use sandkasten_types::{CommandExit, FileInfo, FileKind, Isolation, LimitKind, Limits, PtySize, Workload};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::egress_schemas::NetworkPolicyBody;
use crate::api::isolation::IsolationName;
use crate::api::output::Capture;
pub use crate::api::output::OutputEvent;
use crate::clock::rfc3339;
use crate::sandbox_lifecycle::PauseMode;
use crate::store::{Lifecycle, SandboxRecord, SandboxState};
use sandkasten_types::Tier;

/// Hard limits of a sandbox; omitted fields take their defaults. Mirrors `sandkasten_types::Limits`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsBody {
    /// Wall-clock time for one command, in milliseconds (1 to 86 400 000). Default 10 000.
    #[schema(example = 10_000)]
    pub timeout_ms: u64,
    /// Memory in bytes, swap 0 (8 MiB to 1 TiB). Default 268 435 456 (256 MiB).
    #[schema(example = 268_435_456)]
    pub memory_bytes: u64,
    /// Processes and threads alive at once (1 to 65 536). Default 128.
    pub pids: u64,
    /// CPU bandwidth in CPUs (0.01 to 1024). Default 1.0.
    pub cpus: f64,
    /// Size of each writable filesystem and the largest file, in bytes (1 MiB to 1 TiB). Default 128 MiB.
    pub disk_bytes: u64,
    /// Bytes kept per output stream (1 KiB to 1 GiB). Default 1 MiB.
    pub output_bytes: u64,
}

impl Default for LimitsBody {
    fn default() -> Self {
        Limits::default().into()
    }
}

impl From<Limits> for LimitsBody {
    fn from(l: Limits) -> Self {
        LimitsBody {
            timeout_ms: l.timeout_ms,
            memory_bytes: l.memory_bytes,
            pids: l.pids,
            cpus: l.cpus,
            disk_bytes: l.disk_bytes,
            output_bytes: l.output_bytes,
        }
    }
}

impl From<LimitsBody> for Limits {
    fn from(l: LimitsBody) -> Self {
        Limits {
            timeout_ms: l.timeout_ms,
            memory_bytes: l.memory_bytes,
            pids: l.pids,
            cpus: l.cpus,
            disk_bytes: l.disk_bytes,
            output_bytes: l.output_bytes,
        }
    }
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    /// How strongly the sandbox is isolated from the host; default from the server's config (`[defaults]
    /// isolation`, `process` unless configured). A misspelt tier is 422 `unprocessable` naming the allowed values; a
    /// tier that cannot run here (not available yet, or not installed on this host) is 422 `tier_unavailable`.
    #[serde(default)]
    #[schema(value_type = Option<IsolationName>)]
    pub isolation: Option<Tier>,
    /// What the code needs, for `isolation: "auto"`: `needs` (`language` or `linux`), `io_profile` (`compute` or
    /// `syscall_heavy`), `needs_kernel` (true: only a microVM will do). Default: nothing said.
    #[serde(default)]
    pub workload: Workload,
    /// The sandbox's template: `host` (the default: the host's `/usr` read-only, a synthesised `/etc`), `e2b` (the
    /// same, laid out as E2B programs expect: user `user`, home `/home/user`), or the name of a template built into
    /// the server's template cache (`[templates] cache`; `sandkasten template build`): its layers read-only at `/opt`
    /// and its environment (`PATH` with its venv first, `NODE_PATH`, its `env`) under the request's `env`. A name
    /// that is none of these is 422.
    #[serde(default)]
    pub template: Option<String>,
    /// Hard limits; omitted fields take their defaults.
    #[serde(default)]
    pub limits: Option<LimitsBody>,
    /// Environment variables of every command (POSIX names).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Labels to find the sandbox by (`GET /v1/sandboxes?metadata.KEY=VALUE`); up to 64 entries.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Seconds until the sandbox is destroyed; default from the server's config (300).
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Network access; default `{"mode": "none"}` (nothing outside the sandbox).
    #[serde(default)]
    pub network: Option<NetworkPolicyBody>,
    /// Names of the tenant's secrets to expose as placeholders in environment variables of the same names.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// `auto_pause`: pause instead of destroying at the timeout; `auto_resume`: a request while paused resumes it
    /// first (else 409 `paused`). Both default false.
    #[serde(default)]
    pub lifecycle: Lifecycle,
    /// A snapshot (`sn-…`) of the caller's to start on: its files are unpacked into the new sandbox before it is
    /// handed out. `isolation` and `limits` default to the snapshot's sandbox's; `template` must be its template.
    #[serde(default)]
    pub snapshot: Option<String>,
}

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxStateName {
    /// Usable.
    Running,
    /// Deleted by its tenant.
    Destroyed,
    /// Its processes died outside the server's control.
    Lost,
    /// Its timeout passed.
    Expired,
    /// Paused: no CPU, not counted against the running quota, its timeout clock stopped (`POST …/resume`).
    Paused,
}

impl From<SandboxState> for SandboxStateName {
    fn from(state: SandboxState) -> Self {
        match state {
            SandboxState::Running => SandboxStateName::Running,
            SandboxState::Destroyed => SandboxStateName::Destroyed,
            SandboxState::Lost => SandboxStateName::Lost,
            SandboxState::Expired => SandboxStateName::Expired,
            SandboxState::Paused => SandboxStateName::Paused,
        }
    }
}

/// A sandbox.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxBody {
    /// Id, `sb-` + 16 hex digits.
    #[schema(example = "sb-1e11dbc1b69bccc7")]
    pub id: String,
    /// Owning tenant.
    pub tenant: String,
    /// State.
    pub state: SandboxStateName,
    /// While paused: how (`memory`: its processes and memory kept; `filesystem`: only its files, in the snapshot
    /// store, and the resume starts fresh processes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause_mode: Option<PauseMode>,
    /// The isolation tier it runs on, why (`requested`, `server default`, or the `auto` rule that chose it), and for a
    /// microVM how its guest runs (`accel`: `kvm` or `tcg`).
    pub isolation: Isolation,
    /// Template: `host`, `e2b` or the name of a built template.
    pub template: String,
    /// Hard limits.
    pub limits: LimitsBody,
    /// Labels.
    pub metadata: BTreeMap<String, String>,
    /// Names of the sandbox's environment variables (values are not shown).
    pub env_names: Vec<String>,
    /// Network access.
    pub network: NetworkPolicyBody,
    /// Names of the secrets it holds (as placeholders).
    pub secrets: Vec<String>,
    /// Creation time (RFC 3339, UTC).
    pub created_at: String,
    /// When it will be (or was due to be) destroyed (RFC 3339, UTC).
    pub expires_at: String,
    /// When it stopped running (RFC 3339, UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Why it stopped running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
    /// In a create answer for a microVM: how long its guest took to boot, in milliseconds (QEMU's launch to the
    /// guest agent's greeting; a warm pool's VM booted before the request).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_boot_ms: Option<f64>,
}

impl SandboxBody {
    /// The answer to a create: the sandbox as recorded, with its microVM's boot time when the runtime knows it.
    pub(crate) fn created(record: SandboxRecord, runtime: &dyn sandkasten_runtime::SandboxRuntime) -> SandboxBody {
        let vm_boot_ms = runtime.vm_boot(&record.id).map(|vm| vm.boot_ms());
        SandboxBody { vm_boot_ms, ..record.into() }
    }
}

impl From<SandboxRecord> for SandboxBody {
    fn from(record: SandboxRecord) -> Self {
        SandboxBody {
            id: record.id,
            tenant: record.tenant,
            pause_mode: (record.state == SandboxState::Paused).then_some(if record.pause_snapshot.is_some() {
                PauseMode::Filesystem
            } else {
                PauseMode::Memory
            }),
            state: record.state.into(),
            isolation: record.isolation,
            template: crate::built_templates::name_of(&record.spec),
            limits: record.spec.limits.into(),
            metadata: record.metadata,
            env_names: record.spec.env.into_keys().collect(),
            network: record.spec.network.into(),
            secrets: record.spec.secrets,
            created_at: rfc3339(record.created_ms),
            expires_at: rfc3339(record.expires_ms),
            ended_at: record.ended_ms.map(rfc3339),
            end_reason: record.end_reason,
            vm_boot_ms: None,
        }
    }
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxList {
    /// The tenant's sandboxes, oldest first (ties by id, descending); with `limit`, one page of them.
    pub sandboxes: Vec<SandboxBody>,
    /// Pass as `cursor` for the next page; absent on the last page (and when no `limit` was given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `POST /v1/sandboxes/{id}/timeout`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TimeoutRequest {
    /// Seconds from now until the sandbox is destroyed (replaces the current expiry).
    pub timeout_s: u64,
}

/// `POST /v1/sandboxes/{id}/exec`: give exactly one of `argv` and `cmd`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    /// Program and arguments, looked up on the sandbox's PATH.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// A shell command line, run with `/bin/bash -c`.
    #[serde(default)]
    pub cmd: Option<String>,
    /// Extra environment variables for this command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (absolute); default `/workspace`.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Text written to the command's stdin, which is then closed.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Wall-clock limit in milliseconds, at most the sandbox's `limits.timeout_ms` (the default).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Run in the background: answer 202 with the command's id at once (whatever `Accept` says) and keep it
    /// running after the request; its stdin stays open for `…/commands/{command_id}/stdin` unless `stdin` is given
    /// (then it is written and closed). `timeout_ms` applies as for other commands.
    #[serde(default)]
    pub background: bool,
    /// Changes to the tenant's scan policy for this command (the command line is scanned as bash); they may only
    /// tighten it (a loosening field is 422).
    #[serde(default)]
    pub scan_policy: Option<ScanPolicyOverride>,
    /// Run it on a pseudo-terminal of this size (`cols` and `rows` each 1 to 1000) inside the sandbox: it becomes a
    /// session leader with the terminal as its controlling terminal and as stdin, stdout and stderr; all its output
    /// arrives as `stdout` (with the terminal's `\r\n` line ends and echo). `stdin` is typed into the terminal, whose
    /// input stays open while it runs. Usually with `background: true`: stream `…/commands/{command_id}/stream`,
    /// type with `…/stdin`, resize with `…/resize`.
    #[serde(default)]
    pub pty: Option<PtySize>,
}

/// The result of a command.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct ExecResponse {
    /// The sandbox that ran it.
    pub sandbox_id: String,
    /// The isolation of the sandbox that ran it: its tier, why, and (microVM) `accel`.
    pub isolation: Isolation,
    /// How it ended: exit code or signal, `timed_out`, `oom_killed`, which `limit` fired, `usage`, `phases`.
    #[serde(flatten)]
    pub exit: CommandExit,
    /// Standard output as text; empty when it is binary (not UTF-8, a NUL, many control characters): then
    /// `stdout_base64` has it.
    pub stdout: String,
    /// The exact stdout bytes in base64, only when they are binary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_base64: Option<String>,
    /// Standard error as text; empty when it is binary (then `stderr_base64` has it).
    pub stderr: String,
    /// The exact stderr bytes in base64, only when they are binary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr_base64: Option<String>,
    /// True when stdout went past the sandbox's output limit and was cut.
    pub stdout_truncated: bool,
    /// True when stderr went past the sandbox's output limit and was cut.
    pub stderr_truncated: bool,
    /// Wall-clock time from the request to the result, in milliseconds.
    pub duration_ms: f64,
    /// What the static scan found before the command ran (the tenant's scan policy in mode `warn`, or `enforce`
    /// with nothing blocking); absent when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
}

/// `exit` with the output limit named when a stream was cut (after the time limit, which ended the command).
pub(crate) fn with_output_limit(mut exit: CommandExit, truncated: bool) -> CommandExit {
    if truncated && exit.limit != Some(LimitKind::Time) {
        exit.limit = Some(LimitKind::Output);
    }
    exit
}

impl ExecResponse {
    /// The response for a finished command from its exit and the output kept of it.
    pub(crate) fn new(
        sandbox_id: String,
        isolation: Isolation,
        exit: CommandExit,
        stdout: Capture,
        stderr: Capture,
        duration_ms: f64,
    ) -> ExecResponse {
        let (stdout, stderr) = (stdout.into_stream(), stderr.into_stream());
        let ((stdout_text, stdout_base64), (stderr_text, stderr_base64)) = (stdout.json_forms(), stderr.json_forms());
        ExecResponse {
            sandbox_id,
            isolation,
            exit: with_output_limit(exit, stdout.truncated || stderr.truncated),
            stdout: stdout_text,
            stdout_base64,
            stderr: stderr_text,
            stderr_base64,
            stdout_truncated: stdout.truncated,
            stderr_truncated: stderr.truncated,
            duration_ms,
            findings: Vec::new(),
        }
    }
}

/// Data of the final `exit` event of an exec stream (and of a background command's stream).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExitEvent {
    /// The isolation of the sandbox that ran it: its tier, why, and (microVM) `accel`.
    pub isolation: Isolation,
    /// How it ended: exit code or signal, `timed_out`, `oom_killed`, which `limit` fired, `usage`, `phases`.
    #[serde(flatten)]
    pub exit: CommandExit,
    /// True when stdout went past the output limit (later chunks were not sent).
    pub stdout_truncated: bool,
    /// True when stderr went past the output limit.
    pub stderr_truncated: bool,
    /// Wall-clock time from the request to the end of the command, in milliseconds.
    pub duration_ms: f64,
}

impl ExitEvent {
    /// The event for a command that ended with `exit`, whose streams were cut as said.
    pub(crate) fn new(isolation: Isolation, exit: CommandExit, truncated: [bool; 2], duration_ms: f64) -> ExitEvent {
        let [stdout_truncated, stderr_truncated] = truncated;
        let exit = with_output_limit(exit, stdout_truncated || stderr_truncated);
        ExitEvent { isolation, exit, stdout_truncated, stderr_truncated, duration_ms }
    }
}

/// Kind of a directory entry. Mirrors `sandkasten_types::FileKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKindName {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (not followed).
    Symlink,
    /// Anything else (fifo, socket, device).
    Other,
}

/// Metadata of a path inside a sandbox. Mirrors `sandkasten_types::FileInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FileInfoBody {
    /// Base name.
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Kind.
    pub kind: FileKindName,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (e.g. 420 = 0o644).
    pub mode: u32,
    /// Last modification, milliseconds since the Unix epoch.
    pub modified_unix_ms: i64,
    /// Target of a symlink.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// Owner's uid inside the sandbox (1000 the sandbox user, 0 the sandbox's root).
    pub uid: u32,
    /// Group's gid inside the sandbox.
    pub gid: u32,
}

impl From<FileInfo> for FileInfoBody {
    fn from(info: FileInfo) -> Self {
        FileInfoBody {
            name: info.name,
            path: info.path,
            kind: match info.kind {
                FileKind::File => FileKindName::File,
                FileKind::Dir => FileKindName::Dir,
                FileKind::Symlink => FileKindName::Symlink,
                FileKind::Other => FileKindName::Other,
            },
            size: info.size,
            mode: info.mode,
            modified_unix_ms: info.modified_unix_ms,
            symlink_target: info.symlink_target,
            uid: info.uid,
            gid: info.gid,
        }
    }
}

/// `GET /v1/sandboxes/{id}/files/list`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FileList {
    /// The directory's entries (not recursive).
    pub entries: Vec<FileInfoBody>,
}

/// `POST /v1/sandboxes/{id}/files/mkdir`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    /// Absolute path of the new directory.
    pub path: String,
    /// Create missing parents too (and accept an existing directory).
    #[serde(default)]
    pub parents: bool,
}

/// `POST /v1/sandboxes/{id}/files/rename`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    /// Absolute path to move.
    pub from: String,
    /// Absolute destination path.
    pub to: String,
}

/// `?path=` of the files routes.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PathQuery {
    /// Absolute path inside the sandbox.
    pub path: String,
}

/// `?path=&recursive=` of `DELETE …/files`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RemoveQuery {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Remove a directory with its contents.
    #[serde(default)]
    pub recursive: bool,
}

/// Raw bytes of a file (`application/octet-stream`); only used to describe the files routes.
#[derive(Debug, Clone, ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct FileBytes(pub Vec<u8>);

/// `GET /healthz`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Health {
    /// `ok`, or `unavailable` when a part of the server failed (then with `reason`, and status 503).
    pub status: String,
    /// What failed and what the server is doing about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_mirror_has_the_same_json_as_limits() -> Result<(), serde_json::Error> {
        let limits = Limits { memory_bytes: 64 << 20, cpus: 0.5, ..Limits::default() };
        let mirrored = LimitsBody::from(limits.clone());
        assert_eq!(serde_json::to_value(&mirrored)?, serde_json::to_value(&limits)?);
        assert_eq!(Limits::from(mirrored), limits);
        let partial: LimitsBody = serde_json::from_str(r#"{"pids": 4}"#)?;
        assert_eq!(Limits::from(partial), Limits { pids: 4, ..Limits::default() });
        Ok(())
    }

    #[test]
    fn file_info_mirror_has_the_same_json_as_file_info() -> Result<(), serde_json::Error> {
        for kind in [FileKind::File, FileKind::Dir, FileKind::Symlink, FileKind::Other] {
            let info = FileInfo {
                name: "a".into(),
                path: "/workspace/a".into(),
                kind,
                size: 3,
                mode: 0o644,
                modified_unix_ms: 5,
                symlink_target: (kind == FileKind::Symlink).then(|| "/b".into()),
                uid: 1000,
                gid: 1000,
                metadata: Default::default(),
            };
            assert_eq!(serde_json::to_value(FileInfoBody::from(info.clone()))?, serde_json::to_value(&info)?);
        }
        Ok(())
    }

    #[test]
    fn state_and_template_names_match_the_store_and_types() -> Result<(), serde_json::Error> {
        for state in [
            SandboxState::Running,
            SandboxState::Destroyed,
            SandboxState::Lost,
            SandboxState::Expired,
            SandboxState::Paused,
        ] {
            assert_eq!(serde_json::to_value(SandboxStateName::from(state))?, state.as_str());
        }
        Ok(())
    }
}
