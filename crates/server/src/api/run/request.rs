//! `POST /v1/run`'s request body and its validation into a [`RunPlan`]: the sandbox to create, the files to write,
//! an optional compile step and the command. Every mistake in the request itself is found here, before anything
//! exists; a file path the sandbox cannot write (`/etc/x`, a directory in the way) fails only when it is written, a
//! 4xx after which the run's sandbox is destroyed.

use std::collections::BTreeMap;

use base64::Engine as _;
use sandkasten_scan::{ScanLanguage, ScanPolicyOverride};
use sandkasten_types::{CommandSpec, Language, Limits, SandboxSpec};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::api::egress_schemas::NetworkPolicyBody;
use crate::api::error::ApiError;
use crate::api::isolation::IsolationName;
use crate::api::schemas::LimitsBody;
use crate::config::ZygoteKind;
use crate::state::Settings;
use crate::validate;
use sandkasten_types::Tier;

/// Most files one run may upload.
pub const MAX_RUN_FILES: usize = 256;
/// Seconds a run's sandbox may outlive its time limit before expiry destroys it (writing files, compiling).
const LIFETIME_MARGIN_S: u64 = 60;

/// Language of `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunLanguage {
    /// `python3 /tmp/main.py`.
    Python,
    /// `node /tmp/main.js`.
    Node,
    /// `bash /tmp/main.sh`.
    Bash,
    /// `gcc -O1 -o /tmp/a.out /tmp/main.c -lm`, then `/tmp/a.out`; a failed compile is `error.code = compile_error`.
    C,
}

impl From<RunLanguage> for Language {
    fn from(language: RunLanguage) -> Self {
        match language {
            RunLanguage::Python => Language::Python,
            RunLanguage::Node => Language::Node,
            RunLanguage::Bash => Language::Bash,
            RunLanguage::C => Language::C,
        }
    }
}

/// A file written into the sandbox before the command runs: give exactly one of `content` and `content_base64`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunFile {
    /// Absolute path, or a path relative to `/workspace`; missing parent directories are created.
    pub path: String,
    /// The content as UTF-8 text.
    #[serde(default)]
    pub content: Option<String>,
    /// The exact bytes in base64 (for binary files).
    #[serde(default)]
    pub content_base64: Option<String>,
}

/// `POST /v1/run`: give `language` with `code`, or exactly one of `argv` and `cmd`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// How strongly the run's sandbox is isolated from the host; default from the server's config (`[defaults]
    /// isolation`, `process` unless configured). A tier that cannot run here is 422 `tier_unavailable`.
    #[serde(default)]
    #[schema(value_type = Option<IsolationName>)]
    pub isolation: Option<Tier>,
    /// What the code needs, for `isolation: "auto"`: `needs` (`language` or `linux`), `io_profile` (`compute` or
    /// `syscall_heavy`), `needs_kernel`. Default: nothing said.
    #[serde(default)]
    pub workload: sandkasten_types::Workload,
    /// The run's template: `host` (the default), `e2b` or the name of a template built on the server, as on create.
    #[serde(default)]
    pub template: Option<String>,
    /// Language of `code`.
    #[serde(default)]
    pub language: Option<RunLanguage>,
    /// Source code, stored as `/tmp/main.<ext>` and run (or compiled and run).
    #[serde(default)]
    pub code: Option<String>,
    /// Program and arguments, looked up on the sandbox's PATH.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// A shell command line, run with `/bin/bash -c`.
    #[serde(default)]
    pub cmd: Option<String>,
    /// Environment variables of the command (POSIX names).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Network access of the run's sandbox; default `{"mode": "none"}`.
    #[serde(default)]
    pub network: Option<NetworkPolicyBody>,
    /// Text written to the command's stdin, which is then closed.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Hard limits; `timeout_ms` bounds the whole run (compile and command). Omitted fields take their defaults.
    #[serde(default)]
    pub limits: Option<LimitsBody>,
    /// Files to write before running.
    #[serde(default)]
    pub files: Vec<RunFile>,
    /// Changes to the tenant's scan policy for this run; they may only tighten it (a loosening field is 422). The
    /// scan reads `code` (Python, Node, bash; C is not scanned), or `cmd` / `argv` as a bash command line.
    #[serde(default)]
    pub scan_policy: Option<ScanPolicyOverride>,
}

impl RunRequest {
    /// What the static scan reads of this run: the code in its language, or the command as bash.
    pub(crate) fn scan_input(&self) -> Option<(ScanLanguage, String)> {
        if let (Some(language), Some(code)) = (self.language, &self.code) {
            let language = match language {
                RunLanguage::Python => ScanLanguage::Python,
                RunLanguage::Node => ScanLanguage::Javascript,
                RunLanguage::Bash => ScanLanguage::Bash,
                RunLanguage::C => return None,
            };
            return Some((language, code.clone()));
        }
        match (&self.cmd, &self.argv) {
            (Some(cmd), _) => Some((ScanLanguage::Bash, cmd.clone())),
            (None, Some(argv)) => Some((ScanLanguage::Bash, sandkasten_scan::argv_command_line(argv))),
            (None, None) => None,
        }
    }
}

/// A validated run.
#[derive(Debug, Clone)]
pub(crate) struct RunPlan {
    /// The sandbox to create.
    pub(crate) spec: SandboxSpec,
    /// Its lifetime, in seconds (the time limit plus a margin, at most the server's maximum).
    pub(crate) lifetime_s: u64,
    /// Files to write, by absolute path, in order.
    pub(crate) files: Vec<(String, Vec<u8>)>,
    /// The compile step (C only); its `timeout_ms` is set when it runs.
    pub(crate) compile: Option<CommandSpec>,
    /// The command; its `timeout_ms` is set when it runs.
    pub(crate) command: CommandSpec,
    /// What a pool member's zygote of this kind may be given instead of running `command` (Python or Node code
    /// without env or stdin): the Python source, or the path of the Node program (already among `files`).
    pub(crate) zygote_input: Option<(ZygoteKind, Vec<u8>)>,
}

fn argv(items: &[&str]) -> Option<Vec<String>> {
    Some(items.iter().map(|item| (*item).to_owned()).collect())
}

/// The source file, compile step and command for `code` in `language`.
fn code_steps(language: RunLanguage, code: String) -> ((String, Vec<u8>), Option<CommandSpec>, CommandSpec) {
    let source = format!("/tmp/{}", Language::from(language).source_file_name());
    let command = |items: Option<Vec<String>>| CommandSpec { argv: items, ..CommandSpec::default() };
    let (compile, run) = match language {
        RunLanguage::Python => (None, argv(&["python3", &source])),
        RunLanguage::Node => (None, argv(&["node", &source])),
        RunLanguage::Bash => (None, argv(&["bash", &source])),
        RunLanguage::C => {
            (Some(command(argv(&["gcc", "-O1", "-o", "/tmp/a.out", &source, "-lm"]))), argv(&["/tmp/a.out"]))
        }
    };
    ((source, code.into_bytes()), compile, command(run))
}

fn file(item: RunFile, max_file_bytes: u64) -> Result<(String, Vec<u8>), ApiError> {
    let path = if item.path.starts_with('/') || item.path.is_empty() {
        item.path
    } else {
        format!("/workspace/{}", item.path)
    };
    validate::sandbox_path("files[].path", &path).map_err(ApiError::bad_request)?;
    let data = match (item.content, item.content_base64) {
        (Some(text), None) => text.into_bytes(),
        (None, Some(encoded)) => base64::engine::general_purpose::STANDARD.decode(encoded.trim()).map_err(|error| {
            ApiError::unprocessable(format!("files[] {path}: content_base64 is not base64: {error}"))
        })?,
        _ => {
            return Err(ApiError::unprocessable(format!(
                "files[] {path}: give exactly one of content (text) and content_base64"
            )));
        }
    };
    if data.len() as u64 > max_file_bytes {
        return Err(ApiError::payload_too_large(format!(
            "files[] {path} is {} bytes; the limit is {max_file_bytes}",
            data.len()
        )));
    }
    Ok((path, data))
}

/// Validates a request against the server's settings.
pub(crate) fn plan(body: RunRequest, settings: Settings) -> Result<RunPlan, ApiError> {
    let limits: Limits = body.limits.unwrap_or_default().into();
    limits.validate().map_err(|error| ApiError::unprocessable(format!("limits: {error}")))?;
    let limit_s = limits.timeout_ms.div_ceil(1000);
    if limit_s > settings.max_timeout_s {
        return Err(ApiError::unprocessable(format!(
            "limits.timeout_ms is {} ms; this server allows runs of at most {} s",
            limits.timeout_ms, settings.max_timeout_s
        )));
    }
    validate::environment(&body.env).map_err(ApiError::unprocessable)?;
    if body.files.len() > MAX_RUN_FILES {
        return Err(ApiError::unprocessable(format!("{} files given; the limit is {MAX_RUN_FILES}", body.files.len())));
    }
    let mut files =
        body.files.into_iter().map(|item| file(item, settings.max_file_bytes)).collect::<Result<Vec<_>, _>>()?;
    let mut zygote_input = None;
    let (compile, mut command) = match (body.language, body.code, body.argv.is_some() || body.cmd.is_some()) {
        (Some(_), _, true) | (_, Some(_), true) => {
            return Err(ApiError::unprocessable("give either language with code, or argv/cmd, not both"));
        }
        (Some(language), Some(code), false) => {
            let (source, compile, command) = code_steps(language, code);
            if body.env.is_empty() && body.stdin.is_none() {
                zygote_input = match language {
                    RunLanguage::Python => Some((ZygoteKind::Python, source.1.clone())),
                    RunLanguage::Node => Some((ZygoteKind::Node, source.0.clone().into_bytes())),
                    RunLanguage::Bash | RunLanguage::C => None,
                };
            }
            files.push(source);
            (compile, command)
        }
        (Some(_), None, false) => return Err(ApiError::unprocessable("language needs code: give the source in code")),
        (None, Some(_), false) => {
            return Err(ApiError::unprocessable("code needs language: one of python, node, bash, c"));
        }
        (None, None, _) => {
            let command = CommandSpec { argv: body.argv, cmd: body.cmd, ..CommandSpec::default() };
            let resolved = command.resolved_argv().map_err(|message| {
                ApiError::unprocessable(format!("nothing to run: give language with code, or {message}"))
            })?;
            validate::argv(&resolved).map_err(ApiError::unprocessable)?;
            (None, command)
        }
    };
    command.env = body.env;
    command.stdin = body.stdin;
    let lifetime_s = limit_s.saturating_mul(2).saturating_add(LIFETIME_MARGIN_S).clamp(1, settings.max_timeout_s);
    let network = body.network.unwrap_or_default().into();
    let spec =
        SandboxSpec { isolation: body.isolation, workload: body.workload, limits, network, ..SandboxSpec::default() };
    Ok(RunPlan { spec, lifetime_s, files, compile, command, zygote_input })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            default_timeout_s: 300,
            max_timeout_s: 3600,
            max_file_bytes: 16,
            max_json_bytes: 1 << 20,
            isolation: sandkasten_types::Tier::Process,
            max_pids: None,
            metrics_require_auth: false,
            retention: crate::config::RetentionConfig::default(),
        }
    }

    fn request(json: serde_json::Value) -> Result<RunPlan, ApiError> {
        plan(serde_json::from_value(json).map_err(|e| ApiError::unprocessable(e.to_string()))?, settings())
    }

    #[test]
    fn code_becomes_a_source_file_and_a_command() -> Result<(), ApiError> {
        let plan = request(serde_json::json!({"language": "c", "code": "int main(){}", "stdin": "x"}))?;
        assert_eq!(plan.files, vec![("/tmp/main.c".to_owned(), b"int main(){}".to_vec())]);
        assert_eq!(plan.compile.and_then(|c| c.argv).map(|a| a[0].clone()).as_deref(), Some("gcc"));
        assert_eq!(plan.command.argv, argv(&["/tmp/a.out"]));
        assert_eq!(plan.command.stdin.as_deref(), Some("x"));
        let python = request(serde_json::json!({"language": "python", "code": "print(1)"}))?;
        assert_eq!(python.command.argv, argv(&["python3", "/tmp/main.py"]));
        assert_eq!(python.zygote_input, Some((ZygoteKind::Python, b"print(1)".to_vec())));
        let node = request(serde_json::json!({"language": "node", "code": "console.log(1)"}))?;
        assert_eq!(node.zygote_input, Some((ZygoteKind::Node, b"/tmp/main.js".to_vec())));
        assert_eq!(node.files, vec![("/tmp/main.js".to_owned(), b"console.log(1)".to_vec())]);
        assert!(plan.zygote_input.is_none(), "C never goes to a zygote");
        assert_eq!(python.spec.isolation, None, "the server's default is applied when the sandbox is started");
        let strong = request(serde_json::json!({"language": "python", "code": "1", "isolation": "gvisor"}))?;
        assert_eq!(strong.spec.isolation, Some(sandkasten_types::Tier::Gvisor));
        let bash = request(serde_json::json!({"language": "bash", "code": "echo"}))?;
        assert!(bash.zygote_input.is_none(), "bash has no zygote");
        let with_stdin = request(serde_json::json!({"language": "python", "code": "input()", "stdin": "x"}))?;
        assert!(with_stdin.zygote_input.is_none(), "stdin needs the plain path");
        let with_env = request(serde_json::json!({"language": "node", "code": "1", "env": {"A": "b"}}))?;
        assert!(with_env.zygote_input.is_none(), "env needs the plain path");
        Ok(())
    }

    #[test]
    fn relative_files_land_in_the_workspace_and_bad_ones_are_refused() -> Result<(), ApiError> {
        let plan = request(serde_json::json!({"cmd": "ls", "files": [
            {"path": "a/b.txt", "content": "hi"}, {"path": "/tmp/x", "content_base64": "/w=="}]}))?;
        assert_eq!(plan.files[0], ("/workspace/a/b.txt".to_owned(), b"hi".to_vec()));
        assert_eq!(plan.files[1].1, vec![0xff]);
        let code = |json| request(json).err().map(|e: ApiError| e.code.as_str());
        assert_eq!(
            code(serde_json::json!({"cmd": "ls", "files": [{"path": "../x", "content": ""}]})),
            Some("bad_request")
        );
        assert_eq!(code(serde_json::json!({"cmd": "ls", "files": [{"path": "x"}]})), Some("unprocessable"));
        let big = "x".repeat(17);
        assert_eq!(
            code(serde_json::json!({"cmd": "ls", "files": [{"path": "x", "content": big}]})),
            Some("payload_too_large")
        );
        Ok(())
    }

    #[test]
    fn exactly_one_way_to_say_what_runs() {
        for json in [
            serde_json::json!({}),
            serde_json::json!({"language": "python"}),
            serde_json::json!({"code": "print(1)"}),
            serde_json::json!({"language": "python", "code": "1", "cmd": "ls"}),
            serde_json::json!({"argv": ["ls"], "cmd": "ls"}),
            serde_json::json!({"argv": []}),
            serde_json::json!({"cmd": "ls", "limits": {"timeout_ms": 86_400_000}}),
            serde_json::json!({"cmd": "ls", "env": {"1X": "y"}}),
        ] {
            let error = request(json.clone()).err();
            assert_eq!(error.map(|e| e.code.as_str()), Some("unprocessable"), "{json}");
        }
    }
}
