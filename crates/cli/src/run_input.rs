//! `sandkasten run`'s arguments and their translation into a `SandboxSpec` and an `ExecRequest`, with every mistake
//! reported as one line that says what to do.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use clap::Args;
use sandkasten_types::units::{parse_bytes, parse_duration_ms};
use sandkasten_types::{Command, ExecRequest, Language, Limits, SandboxSpec, Tier, Upload, Workload};

/// Arguments of `sandkasten run`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  sandkasten run --lang python --code 'print(2+2)'\n  \
    echo 'console.log(1)' | sandkasten run --lang node --json\n  sandkasten run --timeout 2s -- ls -la /\n  \
    sandkasten run --server http://127.0.0.1:8080 --lang python --code 'print(1)'   # on a server's warm pool\n  \
    sandkasten run --policy policy.toml --lang python --file main.py   # the static scan first\n\n\
    Exit codes: the program's own; 128+N when killed by signal N; 2 bad input (or refused by --policy); 121 output\n  \
    limit; 122 memory limit; 123 compile error; 124 timeout; 125 sandbox error.")]
pub struct RunArgs {
    /// Language of the code: python, node, bash or c (c is compiled with gcc inside the sandbox).
    #[arg(long, value_name = "LANG")]
    pub lang: Option<String>,
    /// The code to run (otherwise --file, otherwise standard input).
    #[arg(long)]
    pub code: Option<String>,
    /// A file holding the code to run.
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Isolation tier: process (namespaces, seccomp, landlock; shares the host kernel), gvisor (a user-space
    /// kernel between the code and the host's; needs runsc), microvm (a guest kernel of its own; needs QEMU) or auto
    /// (chosen by the `[isolation.auto]` rules from --trust and --workload: the server's with --server, the default
    /// rules here). Default: process, or the server's with --server.
    #[arg(long, value_name = "TIER", value_parser = crate::client::isolation_parser())]
    pub isolation: Option<Tier>,
    /// A built template (`sandkasten template build`): its layers are the sandbox's read-only `/opt`, its
    /// environment (PATH with its venv and npm packages first, NODE_PATH, its `env`) the program's. On every tier;
    /// with --server, a template built on the server (its `[templates] cache`).
    #[arg(long, value_name = "NAME")]
    pub template: Option<String>,
    /// The template cache `--template` reads in a local run. Default /var/lib/sandkasten/templates.
    #[arg(long, value_name = "DIR", env = "SANDKASTEN_TEMPLATES")]
    pub template_cache: Option<PathBuf>,
    /// What the code needs, for `--isolation auto`: `needs=language|linux`, `io_profile=compute|syscall_heavy`,
    /// `needs_kernel=true`, comma-separated (or the request's JSON object, `{"needs": "linux"}`).
    #[arg(long, value_name = "KEY=VALUE,...", value_parser = parse_workload)]
    pub workload: Option<Workload>,
    /// Whose code this is, for a local `--isolation auto`: internal or untrusted (the default, as a server's
    /// tenants). With --server the tenant's own trust applies.
    #[arg(long, value_name = "TRUST", value_parser = ["internal", "untrusted"])]
    pub trust: Option<String>,
    /// Print one JSON object with output, exit status, limits, timings and usage.
    #[arg(long)]
    pub json: bool,
    /// Wall-clock timeout; the whole process tree is killed when it runs out.
    #[arg(long, default_value = "10s", value_name = "DURATION")]
    pub timeout: String,
    /// Memory limit (swap 0); beyond it the kernel OOM-kills inside the sandbox.
    #[arg(long, default_value = "256MiB", value_name = "SIZE")]
    pub memory: String,
    /// Maximum number of processes and threads.
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub pids: u64,
    /// CPU bandwidth, in CPUs (0.5 = half a core).
    #[arg(long, default_value = "1", value_name = "CPUS")]
    pub cpus: String,
    /// Size of /workspace and of /tmp (each), and the largest file a program may write.
    #[arg(long, default_value = "128MiB", value_name = "SIZE")]
    pub disk: String,
    /// Bytes kept per output stream; the sandbox is stopped when a stream goes past it.
    #[arg(long = "output-limit", default_value = "1MiB", value_name = "SIZE")]
    pub output_limit: String,
    /// Environment variable for the program (KEY=VALUE, or KEY to pass this shell's value). Repeatable.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Copy a local file into the sandbox before running (LOCAL:SANDBOX_PATH, relative to /workspace). Repeatable.
    #[arg(long = "upload", value_name = "LOCAL:SANDBOX_PATH")]
    pub upload: Vec<String>,
    /// Send the run to this `sandkasten serve` (http://HOST:PORT) instead of running it here, so that it takes a
    /// warm pool's sandbox; the API key comes from SANDKASTEN_API_KEY.
    #[arg(long, env = "SANDKASTEN_SERVER", hide_env_values = true, value_name = "URL")]
    pub server: Option<String>,
    /// Network access (with --server only): hosts the run may reach through the server's egress proxy.
    #[command(flatten)]
    pub network: crate::client::NetworkArgs,
    /// A scan policy (TOML) applied before anything runs: in `enforce` a blocking finding exits 2 with the
    /// findings and nothing runs; in `warn` the findings go to stderr and the run goes on.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// A program and its arguments to run instead of code (after `--`).
    #[arg(last = true, value_name = "PROGRAM")]
    pub program: Vec<String>,
}

/// Where the program's standard input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramStdin {
    /// The CLI's own standard input.
    Inherit,
    /// Nothing (the code itself came from standard input).
    Empty,
}

/// A fully validated run.
#[derive(Debug)]
pub struct RunInput {
    /// The sandbox to create (`isolation` as given: unset means process here, the server's default with
    /// `--server`).
    pub spec: SandboxSpec,
    /// What to run in it.
    pub request: ExecRequest,
    /// Where stdin comes from.
    pub stdin: ProgramStdin,
    /// `--template` of a run on a server (which resolves the name itself); local runs carry it in `spec`.
    pub server_template: Option<String>,
}

fn limits(args: &RunArgs) -> Result<Limits, String> {
    let cpus: f64 =
        args.cpus.trim().parse().map_err(|_| format!("--cpus '{}' is not a number: use e.g. 1, 0.5, 2", args.cpus))?;
    let limits = Limits {
        timeout_ms: parse_duration_ms(&args.timeout).map_err(|e| format!("--timeout: {e}"))?,
        memory_bytes: parse_bytes(&args.memory).map_err(|e| format!("--memory: {e}"))?,
        pids: args.pids,
        cpus,
        disk_bytes: parse_bytes(&args.disk).map_err(|e| format!("--disk: {e}"))?,
        output_bytes: parse_bytes(&args.output_limit).map_err(|e| format!("--output-limit: {e}"))?,
    };
    limits.validate().map_err(|e| e.to_string())?;
    Ok(limits)
}

fn environment(args: &RunArgs) -> Result<BTreeMap<String, String>, String> {
    let mut env = BTreeMap::new();
    for item in &args.env {
        let (key, value) = match item.split_once('=') {
            Some((key, value)) => (key.to_owned(), value.to_owned()),
            None => {
                let value = std::env::var(item)
                    .map_err(|_| format!("--env {item}: no such variable in this shell; use --env {item}=VALUE"))?;
                (item.clone(), value)
            }
        };
        if key.is_empty() || key.contains('\0') || value.contains('\0') {
            return Err(format!("--env '{item}' is not KEY=VALUE with a non-empty KEY"));
        }
        env.insert(key, value);
    }
    Ok(env)
}

fn uploads(args: &RunArgs) -> Result<Vec<Upload>, String> {
    args.upload
        .iter()
        .map(|item| {
            let (local, destination) = match item.rsplit_once(':') {
                Some((local, destination)) if !local.is_empty() => (local.to_owned(), destination.to_owned()),
                _ => {
                    let name = PathBuf::from(item).file_name().map(|n| n.to_string_lossy().into_owned());
                    (item.clone(), name.unwrap_or_default())
                }
            };
            let contents = std::fs::read(&local).map_err(|e| format!("--upload: cannot read '{local}': {e}"))?;
            let executable = std::fs::metadata(&local).map(|m| m.permissions().mode() & 0o111 != 0).unwrap_or(false);
            Ok(Upload { path: destination, contents, mode: if executable { 0o755 } else { 0o644 } })
        })
        .collect()
}

fn code_and_stdin(args: &RunArgs, language: Language) -> Result<(String, ProgramStdin), String> {
    if let Some(code) = &args.code {
        return Ok((code.clone(), ProgramStdin::Inherit));
    }
    if let Some(path) = &args.file {
        let code =
            std::fs::read_to_string(path).map_err(|e| format!("--file: cannot read '{}': {e}", path.display()))?;
        return Ok((code, ProgramStdin::Inherit));
    }
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(format!("no {} code given: pass --code, --file, or pipe the code on stdin", language.name()));
    }
    let mut code = String::new();
    stdin.read_to_string(&mut code).map_err(|e| format!("reading the code from stdin failed: {e}"))?;
    Ok((code, ProgramStdin::Empty))
}

/// Validates the arguments and reads the code, uploads and environment they name.
pub fn parse(args: &RunArgs) -> Result<RunInput, String> {
    let limits = limits(args)?;
    if args.code.is_some() && args.file.is_some() {
        return Err("give the code with --code or with --file, not both".into());
    }
    let (command, stdin) = match (&args.lang, args.program.is_empty()) {
        (Some(_), false) => return Err("give either --lang with code, or a program after `--`, not both".into()),
        (None, true) => {
            return Err("nothing to run: pass --lang LANG with --code/--file/stdin, or a program after `--`".into());
        }
        (None, false) => {
            if args.code.is_some() || args.file.is_some() {
                return Err("--code and --file need --lang".into());
            }
            (Command::Argv(args.program.clone()), ProgramStdin::Inherit)
        }
        (Some(name), true) => {
            let language = Language::from_name(name).ok_or_else(|| {
                let known: Vec<&str> = Language::ALL.iter().map(|l| l.name()).collect();
                format!("unknown language '{name}': use one of {}", known.join(", "))
            })?;
            let (code, stdin) = code_and_stdin(args, language)?;
            (Command::Code { language, code }, stdin)
        }
    };
    if args.trust.is_some() && args.server.is_some() {
        return Err("--trust is for a local run: a server applies its tenant's trust ([[tenants]] trust)".into());
    }
    let workload = args.workload.unwrap_or_default();
    let mut spec = SandboxSpec { isolation: args.isolation, limits, workload, ..SandboxSpec::default() };
    if let Some(policy) = args.network.policy() {
        if args.server.is_none() {
            return Err("--network, --allow and --deny need the egress proxy of a server: add --server URL (or \
                        SANDKASTEN_SERVER); a local run has no network at all"
                .into());
        }
        spec.network = serde_json::from_value(policy).map_err(|e| format!("--network: {e}"))?;
    }
    let mut server_template = None;
    if let Some(name) = &args.template
        && args.server.is_some()
    {
        server_template = Some(name.clone());
    } else if let Some(name) = &args.template {
        let root = args.template_cache.clone().unwrap_or_else(|| sandkasten_template::cache::DEFAULT_ROOT.into());
        let cache = sandkasten_template::TemplateCache::open(root).map_err(|e| e.to_string())?;
        let record = cache.template(name).map_err(|e| e.to_string())?;
        spec.layers = cache.layers_of(&record);
        spec.env = record.env;
    }
    let request = ExecRequest { command, env: environment(args)?, uploads: uploads(args)? };
    Ok(RunInput { spec, request, stdin, server_template })
}

/// `--workload`: the request's JSON object, or `key=value` pairs read as its fields (`needs_kernel` takes a
/// boolean; a bare `needs_kernel` means true).
pub fn parse_workload(text: &str) -> Result<Workload, String> {
    let value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| format!("not a JSON workload: {e}"))?
    } else {
        let mut fields = serde_json::Map::new();
        for pair in text.split(',').map(str::trim).filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
            let value = match value {
                "true" => serde_json::Value::Bool(true),
                "false" => serde_json::Value::Bool(false),
                other => serde_json::Value::String(other.to_owned()),
            };
            fields.insert(key.to_owned(), value);
        }
        serde_json::Value::Object(fields)
    };
    serde_json::from_value(value).map_err(|e| {
        format!("{e}: give needs=language|linux, io_profile=compute|syscall_heavy, needs_kernel=true|false")
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn args(items: &[&str]) -> Result<RunArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("run").chain(items.iter().copied())).map(|cli| cli.run)
    }

    #[test]
    fn a_workload_is_parsed_from_pairs_or_json_and_goes_into_the_spec() -> Result<(), Box<dyn std::error::Error>> {
        use sandkasten_types::{CodeNeeds, IoProfile};
        let input = parse(&args(&[
            "--isolation",
            "auto",
            "--workload",
            "needs=linux,io_profile=syscall_heavy",
            "--",
            "true",
        ])?)?;
        assert_eq!(input.spec.isolation, Some(Tier::Auto));
        assert_eq!(input.spec.workload.needs, Some(CodeNeeds::Linux));
        assert_eq!(input.spec.workload.io_profile, Some(IoProfile::SyscallHeavy));
        assert!(parse_workload("needs_kernel")?.needs_kernel);
        assert!(parse_workload(r#"{"needs_kernel": true}"#)?.needs_kernel);
        assert!(parse(&args(&["--", "true"])?)?.spec.workload.is_unset());
        let error = parse_workload("needs=everything").err().unwrap_or_default();
        assert!(error.contains("everything") && error.contains("needs=language|linux"), "{error}");
        let error = parse_workload("kernel=true").err().unwrap_or_default();
        assert!(error.contains("kernel") && error.contains("needs_kernel"), "{error}");
        Ok(())
    }

    #[test]
    fn isolation_goes_into_the_spec_and_is_unset_by_default() -> Result<(), Box<dyn std::error::Error>> {
        let input = parse(&args(&["--isolation", "gvisor", "--", "true"])?)?;
        assert_eq!(input.spec.isolation, Some(Tier::Gvisor));
        assert_eq!(parse(&args(&["--isolation=process", "--", "true"])?)?.spec.isolation, Some(Tier::Process));
        assert_eq!(parse(&args(&["--", "true"])?)?.spec.isolation, None);
        Ok(())
    }

    #[test]
    fn a_misspelt_tier_is_a_usage_error_naming_the_tiers() {
        let error = args(&["--isolation", "gvsior", "--", "true"]).err();
        assert_eq!(error.as_ref().map(clap::Error::exit_code), Some(2));
        let message = error.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("gvsior") && message.contains("process, gvisor, microvm, auto"), "{message}");
    }
}
