//! Translating a request into what the agent runs: the files of the sandbox (synthesised `/etc`, the source code,
//! uploads), the compile step, the program's argv and its environment.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use sandkasten_jail::environment;
use sandkasten_jail::rootfs::SandboxFile;
use sandkasten_types::{
    Command, ExecRequest, Language, PROXY_PORT, SandboxSpec, Template, proxy_environment, units::format_bytes,
};

use sandkasten_protocol::{AgentPlan, DoorExit, DoorPlan, SeccompPolicy};
use sandkasten_types::Tier;

use crate::error::RuntimeError;

/// The sandbox user's uid and gid inside the user namespace.
pub const SANDBOX_UID: u32 = 1000;
/// See `SANDBOX_UID`.
pub const SANDBOX_GID: u32 = 1000;
/// Home and working directory.
pub const WORKSPACE: &str = "/workspace";
/// Largest source text accepted, in bytes.
pub const MAX_CODE_BYTES: usize = 1 << 20;
/// Where source code is stored inside the sandbox (read-only).
pub const CODE_DIR: &str = "/sandbox";
/// Where the compiled C program is written.
const C_BINARY: &str = "/tmp/.sandkasten-main";

/// What the agent will run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    /// Files of the sandbox's own root (synthesised `/etc`, the source code), written before it is sealed.
    pub files: Vec<SandboxFile>,
    /// The caller's uploads into `/workspace` and `/tmp`, written once the agent is in the sandbox's cgroup (so their
    /// pages are charged to the sandbox).
    pub uploads: Vec<SandboxFile>,
    /// Compile step, if the language needs one.
    pub compile: Option<Vec<String>>,
    /// The program and its arguments.
    pub program: Vec<String>,
    /// Complete environment.
    pub env: BTreeMap<String, String>,
}

fn system_file(path: &str, contents: &str) -> SandboxFile {
    SandboxFile { path: path.into(), contents: contents.as_bytes().to_vec(), mode: 0o644, owned_by_sandbox_user: false }
}

/// The home of the e2b template's user.
pub const E2B_HOME: &str = "/home/user";

/// How a template lays out the sandbox user (uid 1000).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserLayout {
    /// The user's name (in the synthesised `/etc/passwd`).
    pub name: &'static str,
    /// Its home: its writable tmpfs and the default working directory.
    pub home: &'static str,
}

/// The sandbox user's layout in a template.
pub fn user_of(template: Template) -> UserLayout {
    match template {
        Template::Host => UserLayout { name: "sandbox", home: WORKSPACE },
        Template::E2b => UserLayout { name: "user", home: E2B_HOME },
    }
}

/// The directories a sandbox of `template` can write (its home, `/tmp`, `/dev/shm`): what a filesystem snapshot or a
/// fork copies.
pub fn writable_dirs(template: Template) -> Vec<String> {
    vec![user_of(template).home.to_owned(), "/tmp".to_owned(), "/dev/shm".to_owned()]
}

/// Where a home's skeleton comes from: the system's `/etc/skel`, the files `useradd -m` copies into a new home.
pub const SKELETON_DIR: &str = "/etc/skel";
/// A skeleton file larger than this is left out (Debian's are a few KiB).
const SKELETON_FILE_MAX_BYTES: u64 = 64 << 10;

/// The home skeleton of `template`'s user: for the E2B user (whose base image made its home with `useradd -m`) the
/// regular files directly in `skeleton` (`SKELETON_DIR`), owned by the user; none for the native `/workspace`.
pub fn home_skeleton(template: Template, skeleton: &Path) -> Vec<SandboxFile> {
    let home = user_of(template).home;
    if home == WORKSPACE {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(skeleton) else { return Vec::new() };
    let mut files: Vec<SandboxFile> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let meta = entry.metadata().ok()?;
            if !meta.file_type().is_file() || meta.len() > SKELETON_FILE_MAX_BYTES {
                return None;
            }
            Some(SandboxFile {
                path: Path::new(home).join(entry.file_name()),
                contents: std::fs::read(entry.path()).ok()?,
                mode: 0o644,
                owned_by_sandbox_user: true,
            })
        })
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

/// `/etc` files synthesised for every sandbox: only the sandbox's own users (uid 1000 named by the layout, or by a
/// built template on the `host` layout), no host accounts, no DNS servers.
fn etc_files(spec: &SandboxSpec) -> Vec<SandboxFile> {
    let UserLayout { name, home } = user_of(spec.template);
    let user = match (spec.template, &spec.layers.user) {
        (Template::Host, Some(user)) => user.as_str(),
        _ => name,
    };
    vec![
        system_file(
            "/etc/passwd",
            &format!(
                "root:x:0:0:root:/root:/bin/bash\n{user}:x:1000:1000:{user}:{home}:/bin/bash\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        system_file("/etc/group", &format!("root:x:0:\n{user}:x:1000:\nnogroup:x:65534:\n")),
        system_file("/etc/hosts", "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
        system_file("/etc/hostname", "sandbox\n"),
        system_file("/etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\n"),
        system_file("/etc/resolv.conf", "# no network: no name servers\n"),
    ]
}

/// Where an upload lands: relative paths are under /workspace; absolute ones must be under /workspace or /tmp.
pub fn upload_destination(path: &str) -> Result<PathBuf, RuntimeError> {
    let candidate = Path::new(path);
    let absolute = if candidate.is_absolute() { candidate.to_path_buf() } else { Path::new(WORKSPACE).join(candidate) };
    let clean = absolute.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    let inside = ["/workspace/", "/tmp/"].iter().any(|dir| absolute.starts_with(dir) && absolute != Path::new(dir));
    if !clean || !inside || path.is_empty() {
        return Err(RuntimeError::InvalidInput(format!(
            "upload destination '{path}' must be a file path under /workspace or /tmp, without '..'"
        )));
    }
    Ok(absolute)
}

/// The source file, the compile step and the program of a piece of code.
type CodePlan = (SandboxFile, Option<Vec<String>>, Vec<String>);

fn code_plan(language: Language, code: &str) -> Result<CodePlan, RuntimeError> {
    if code.len() > MAX_CODE_BYTES {
        return Err(RuntimeError::InvalidInput(format!(
            "the code is {}; the limit is {}: upload large inputs as files instead",
            format_bytes(code.len() as u64),
            format_bytes(MAX_CODE_BYTES as u64)
        )));
    }
    let source = format!("{CODE_DIR}/{}", language.source_file_name());
    let file = SandboxFile {
        path: source.clone().into(),
        contents: code.as_bytes().to_vec(),
        mode: 0o444,
        owned_by_sandbox_user: false,
    };
    let argv = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let (compile, program) = match language {
        Language::Python => (None, argv(&["python3", &source])),
        Language::Node => (None, argv(&["node", &source])),
        Language::Bash => (None, argv(&["bash", &source])),
        Language::C => (Some(argv(&["gcc", "-O1", "-o", C_BINARY, &source, "-lm"])), argv(&[C_BINARY])),
    };
    Ok((file, compile, program))
}

/// Builds the run plan, validating everything that can be checked before any resource exists.
pub fn plan(spec: &SandboxSpec, request: &ExecRequest) -> Result<RunPlan, RuntimeError> {
    spec.limits.validate().map_err(|e| RuntimeError::InvalidInput(e.to_string()))?;
    crate::host_pids::check_pids(spec.limits.pids)?;
    if spec.template != Template::Host {
        return Err(RuntimeError::InvalidInput("one-shot runs use the host template".to_owned()));
    }
    check_layers(spec)?;
    let mut files = etc_files(spec);
    let (compile, program) = match &request.command {
        Command::Argv(argv) if argv.is_empty() || argv[0].is_empty() => {
            return Err(RuntimeError::InvalidInput("no program given: pass one after `--`".to_owned()));
        }
        Command::Argv(argv) => (None, argv.clone()),
        Command::Code { language, code } => {
            let (file, compile, program) = code_plan(*language, code)?;
            files.push(file);
            (compile, program)
        }
    };
    let mut uploaded = 0u64;
    let mut uploads = Vec::with_capacity(request.uploads.len());
    for upload in &request.uploads {
        uploaded += upload.contents.len() as u64;
        uploads.push(SandboxFile {
            path: upload_destination(&upload.path)?,
            contents: upload.contents.clone(),
            mode: upload.mode & 0o777,
            owned_by_sandbox_user: true,
        });
    }
    if uploaded > spec.limits.disk_bytes {
        return Err(RuntimeError::InvalidInput(format!(
            "uploads total {}, more than the disk limit of {}: raise --disk",
            format_bytes(uploaded),
            format_bytes(spec.limits.disk_bytes)
        )));
    }
    let mut extra = spec.env.clone();
    extra.extend(request.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    if let Some(bad) = extra.keys().find(|k| !environment::is_valid_name(k)) {
        return Err(RuntimeError::InvalidInput(format!("'{bad}' is not a valid environment variable name")));
    }
    let env = environment::build(WORKSPACE, &extra);
    Ok(RunPlan { files, uploads, compile, program, env })
}

/// The plan of a long-lived sandbox: its own files and environment; what runs comes later, command by command.
/// The agent's plan for a sandbox of `spec` with `run_plan`'s files and environment: the user, the home, the environment, the
/// limits, the seccomp policy, the root files (built by the agent on the process tier; in the bundle on gVisor, so
/// empty there), and the egress door where the agent must open it.
pub fn agent_plan(spec: &SandboxSpec, run_plan: RunPlan, oom_score_adj: i32) -> AgentPlan {
    let home = user_of(spec.template).home;
    let tier = spec.tier();
    let gvisor = tier == Tier::Gvisor;
    // Where the host's cgroup cannot count the sandbox's processes (the Sentry's threads; a guest kernel's), the
    // agent limits them with RLIMIT_NPROC.
    let counted_inside = matches!(tier, Tier::Gvisor | Tier::Microvm);
    AgentPlan {
        tier,
        home: home.to_owned(),
        uid: SANDBOX_UID,
        gid: SANDBOX_GID,
        env: run_plan.env,
        disk_bytes: spec.limits.disk_bytes,
        // The agent counts as one of the sandbox's processes, as in the process tier's pids cgroup.
        processes: counted_inside.then_some(spec.limits.pids.saturating_sub(1).max(1)),
        // `/dev/pts`: the sandbox's own terminals (a program may reopen its terminal or open new ones via `/dev/ptmx`).
        writable_dirs: [home, "/tmp", "/dev/shm", "/dev/pts"]
            .into_iter()
            .chain(spec.layers.capture.is_some().then_some(sandkasten_jail::rootfs::TEMPLATE_DIR))
            .map(str::to_owned)
            .collect(),
        writable_files: ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"].map(str::to_owned).to_vec(),
        seccomp: SeccompPolicy::Sandbox,
        root_files: if gvisor { Vec::new() } else { run_plan.files },
        oom_score_adj,
        // Where the host cannot listen inside (gVisor's network stack is the Sentry's, a microVM's guest has no
        // network device), the agent opens the door.
        door: door_exit(tier).map(|exit| DoorPlan { port: PROXY_PORT, exit }),
        vmm: None,
        template: spec.layers.clone(),
        home_files: home_skeleton(spec.template, Path::new(SKELETON_DIR)),
    }
}

/// A built template's layers mount on the process tier (an overlay at `/opt`), on gVisor (the same overlay, mounted
/// in runsc's mount namespace and bound at `/opt`) and in microVMs (an image of them, the guest's `/opt`); each must be
/// an absolute path. Its `workdir` must be a clean absolute path and its `user` a sandbox user's name.
fn check_layers(spec: &SandboxSpec) -> Result<(), RuntimeError> {
    // What a template cache says goes into `/etc/passwd` and becomes every command's working directory.
    if let Some(workdir) = &spec.layers.workdir {
        let clean = Path::new(workdir).components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !workdir.starts_with('/') || !clean {
            return Err(RuntimeError::InvalidInput(format!(
                "template workdir {workdir:?} is not a clean absolute path"
            )));
        }
    }
    if let Some(user) = &spec.layers.user {
        sandkasten_types::check_user_name(user)
            .map_err(|why| RuntimeError::InvalidInput(format!("template user {user:?}: {why}")))?;
    }
    if spec.layers.is_empty() {
        return Ok(());
    }
    if spec.layers.capture.is_some() && spec.tier() != Tier::Process {
        return Err(RuntimeError::InvalidInput("template build sandboxes run on the process tier".to_owned()));
    }
    let paths = spec.layers.layers.iter().chain(&spec.layers.capture);
    if let Some(relative) = paths.into_iter().find(|path| !path.is_absolute()) {
        return Err(RuntimeError::InvalidInput(format!(
            "template layer {} is not an absolute path",
            relative.display()
        )));
    }
    Ok(())
}

/// How the agent's egress door leads to the host on `tier`, where the agent opens one.
fn door_exit(tier: Tier) -> Option<DoorExit> {
    match tier {
        Tier::Gvisor => Some(DoorExit::Socket(crate::backend::gvisor::DOOR_SOCKET_INSIDE.to_owned())),
        Tier::Microvm => Some(DoorExit::VirtioPort(crate::backend::microvm::DOOR_PORT.to_owned())),
        _ => None,
    }
}

pub fn plan_live(spec: &SandboxSpec) -> Result<RunPlan, RuntimeError> {
    spec.limits.validate().map_err(|e| RuntimeError::InvalidInput(e.to_string()))?;
    check_layers(spec)?;
    crate::host_pids::check_pids(spec.limits.pids)?;
    if let Some(bad) = spec.env.keys().find(|k| !environment::is_valid_name(k)) {
        return Err(RuntimeError::InvalidInput(format!("'{bad}' is not a valid environment variable name")));
    }
    let mut files = etc_files(spec);
    files.push(system_file(NODE_FETCH_PROXY, include_str!("../../../resources/node/fetch_proxy.cjs")));
    Ok(RunPlan {
        files,
        uploads: Vec::new(),
        compile: None,
        program: Vec::new(),
        env: environment::build(user_of(spec.template).home, &with_proxy_environment(&spec.env)),
    })
}

/// Whether the runtime sets the environment variable `name` in every long-lived sandbox: the base environment, the
/// proxy variables (both cases) and Node's preload (`NODE_OPTIONS`).
pub fn sets_variable(name: &str) -> bool {
    environment::BASE_NAMES.contains(&name) || with_proxy_environment(&BTreeMap::new()).contains_key(name)
}

/// Preloaded by Node (NODE_OPTIONS) in long-lived sandboxes: routes `fetch` through the egress proxy, which Node
/// before 24 does not do by itself.
const NODE_FETCH_PROXY: &str = "/etc/sandkasten/node-fetch-proxy.cjs";

/// The proxy variables every long-lived sandbox gets (`proxy_environment`, and Node's fetch preload), under the
/// caller's own variables. They point at the egress proxy's port on the sandbox's loopback, where nothing listens
/// while the network policy is `none`; a live policy change opens it without restarting anything.
fn with_proxy_environment(env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut all = proxy_environment(PROXY_PORT);
    all.insert("NODE_OPTIONS".to_owned(), format!("--require={NODE_FETCH_PROXY}"));
    all.extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::unwrap_used)]
    fn the_e2b_user_s_home_gets_the_skeleton_s_regular_files_and_the_native_home_none() {
        let skeleton = tempfile::tempdir().unwrap();
        std::fs::write(skeleton.path().join(".bashrc"), "# bashrc\n").unwrap();
        std::fs::write(skeleton.path().join(".profile"), "# profile\n").unwrap();
        std::fs::write(skeleton.path().join("huge"), vec![b'x'; (SKELETON_FILE_MAX_BYTES + 1) as usize]).unwrap();
        std::fs::create_dir(skeleton.path().join(".config")).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", skeleton.path().join(".link")).unwrap();
        let files = home_skeleton(Template::E2b, skeleton.path());
        let paths: Vec<_> = files.iter().map(|f| f.path.to_string_lossy().into_owned()).collect();
        assert_eq!(paths, ["/home/user/.bashrc", "/home/user/.profile"]);
        assert!(files.iter().all(|f| f.owned_by_sandbox_user && f.mode == 0o644));
        assert_eq!(files[0].contents, b"# bashrc\n");
        assert!(home_skeleton(Template::Host, skeleton.path()).is_empty());
        assert!(home_skeleton(Template::E2b, Path::new("/nonexistent-skeleton")).is_empty());
    }

    #[test]
    fn the_e2b_template_names_its_user_and_home() {
        let spec = SandboxSpec { template: Template::E2b, ..SandboxSpec::default() };
        let plan = plan_live(&spec).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plan.env.get("HOME").map(String::as_str), Some("/home/user"));
        let passwd = plan.files.iter().find(|f| f.path == Path::new("/etc/passwd")).map(|f| f.contents.clone());
        let passwd = String::from_utf8(passwd.unwrap_or_default()).unwrap_or_default();
        assert!(passwd.contains("\nuser:x:1000:1000:user:/home/user:/bin/bash\n"), "{passwd}");
        let host = plan_live(&SandboxSpec::default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(host.env.get("HOME").map(String::as_str), Some("/workspace"));
        let one_shot =
            ExecRequest { command: Command::Argv(vec!["true".into()]), env: BTreeMap::new(), uploads: vec![] };
        assert!(super::plan(&spec, &one_shot).is_err(), "one-shot runs take only the host template");
    }

    #[test]
    fn uploads_stay_inside_the_writable_dirs() {
        assert_eq!(upload_destination("data.csv").ok(), Some(PathBuf::from("/workspace/data.csv")));
        assert_eq!(upload_destination("/tmp/x").ok(), Some(PathBuf::from("/tmp/x")));
        for bad in ["../etc/passwd", "/etc/passwd", "/workspace/../etc/x", "/workspace", "", "/tmpx/a"] {
            assert!(upload_destination(bad).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn c_is_compiled_then_run() {
        let request = ExecRequest {
            command: Command::Code { language: Language::C, code: "int main(){return 0;}".into() },
            env: BTreeMap::new(),
            uploads: vec![],
        };
        let plan = plan(&SandboxSpec::default(), &request).unwrap_or_else(|e| panic!("{e}"));
        assert!(plan.compile.is_some());
        assert_eq!(plan.program, vec![C_BINARY.to_owned()]);
    }

    #[test]
    fn oversized_code_is_refused() {
        let request = ExecRequest {
            command: Command::Code { language: Language::Python, code: "#".repeat(MAX_CODE_BYTES + 1) },
            env: BTreeMap::new(),
            uploads: vec![],
        };
        let message = plan(&SandboxSpec::default(), &request).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("the limit is 1MiB"), "{message}");
    }
}
