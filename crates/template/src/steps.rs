//! A spec as the ordered build steps it becomes (packages, files, `run` commands), each with its cache key:
//! SHA-256 of the parent's key, the step's definition, the digests of its input files and the template's `env`. An
//! unchanged prefix of steps keeps its keys, so its layers are reused; a changed step changes its key and every
//! later one.

use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::SpecError;
use crate::spec::{Base, NPM_PREFIX, TemplateSpec, VENV_DIR};

/// Largest file a `[[files]]` entry may copy in, in bytes.
pub const MAX_FILE_BYTES: u64 = 8 << 20;

/// Part of every key, so a change to how keys are made invalidates old cache entries.
const STEP_FORMAT: &str = "sandkasten-template-step/1";

/// What one step does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Debian packages (Debian bases only).
    Apt(Vec<String>),
    /// Python requirements into the template's venv.
    Pip(Vec<String>),
    /// Global npm packages under the template's npm prefix.
    Npm(Vec<String>),
    /// Files copied in.
    Files(Vec<FileInput>),
    /// A shell command.
    Run(String),
}

/// One file of a `Files` step, as read at planning time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileInput {
    /// Where it goes in the template.
    pub dest: String,
    /// Its permission bits.
    pub mode: u32,
    /// SHA-256 of its contents, hex.
    pub digest: String,
    /// Its contents (not part of the key: the digest is).
    #[serde(skip)]
    pub contents: Vec<u8>,
}

/// One build step and its cache key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildStep {
    /// 0-based position.
    pub index: usize,
    /// What it does.
    pub kind: StepKind,
    /// Its cache key, hex.
    pub key: String,
}

impl BuildStep {
    /// The shell command the step runs in its build sandbox (a `Files` step writes its files first, then runs this).
    pub fn command(&self) -> String {
        command_of(&self.kind)
    }

    /// A short name for progress lines and errors, e.g. `pip tabulate==0.10.0` or `run[1] make`.
    pub fn title(&self) -> String {
        match &self.kind {
            StepKind::Apt(packages) => format!("apt {}", packages.join(" ")),
            StepKind::Pip(packages) => format!("pip {}", packages.join(" ")),
            StepKind::Npm(packages) => format!("npm {}", packages.join(" ")),
            StepKind::Files(files) => {
                format!("files {}", files.iter().map(|f| f.dest.as_str()).collect::<Vec<_>>().join(" "))
            }
            StepKind::Run(command) => format!("run {command}"),
        }
    }
}

/// The shell command a step of `kind` runs.
fn command_of(kind: &StepKind) -> String {
    {
        match kind {
            StepKind::Apt(packages) => {
                format!("apt-get update && apt-get install -y --no-install-recommends -- {}", quoted(packages))
            }
            StepKind::Pip(packages) => format!(
                "set -e; [ -x {VENV_DIR}/bin/python ] || python3 -m venv {VENV_DIR}; \
                 {VENV_DIR}/bin/pip install --no-cache-dir --disable-pip-version-check --no-input -- {}",
                quoted(packages)
            ),
            StepKind::Npm(packages) => format!(
                "set -e; npm install --global --prefix {NPM_PREFIX} --no-fund --no-audit \
                 --no-update-notifier -- {}",
                quoted(packages)
            ),
            StepKind::Files(files) => files
                .iter()
                .map(|file| format!("chmod {:o} {}", file.mode, quote(&file.dest)))
                .collect::<Vec<_>>()
                .join(" && "),
            StepKind::Run(command) => command.clone(),
        }
    }
}

fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

fn quoted(words: &[String]) -> String {
    words.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ")
}

/// SHA-256 of `bytes`, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key the first step's parent has: the base's. A template base (`built`: its record) adds its digest and
/// environment, so a rebuilt base (new layers, or the same layers with another `env`) rebuilds what extends it.
pub fn base_key(base: &Base, built: Option<&crate::TemplateRecord>) -> String {
    match built {
        None => sha256_hex(format!("{STEP_FORMAT}\nbase:{base}").as_bytes()),
        Some(record) => {
            let env = serde_json::to_string(&record.env).unwrap_or_default();
            sha256_hex(format!("{STEP_FORMAT}\nbase:{base}\ndigest:{}\nenv:{env}", record.digest).as_bytes())
        }
    }
}

/// Where a spec's `[[files]]` are read from: the spec's directory (a file on disk), or the files a build request
/// carried (the API's).
pub trait FileSource {
    /// The contents of `files[index]`'s `src`.
    fn read(&self, index: usize, src: &str) -> Result<Vec<u8>, SpecError>;
}

/// The files next to a spec on disk.
pub struct SpecDir<'a>(pub &'a Path);

impl FileSource for SpecDir<'_> {
    fn read(&self, index: usize, src: &str) -> Result<Vec<u8>, SpecError> {
        let path: PathBuf = self.0.join(src);
        let size = std::fs::metadata(&path).map_err(|source| SpecError::Read { path: path.clone(), source })?.len();
        check_size(index, &path.display().to_string(), size)?;
        std::fs::read(&path).map_err(|source| SpecError::Read { path, source })
    }
}

/// Files given by name (`src`) with their contents.
impl FileSource for std::collections::BTreeMap<String, Vec<u8>> {
    fn read(&self, index: usize, src: &str) -> Result<Vec<u8>, SpecError> {
        let contents = self.get(src).ok_or_else(|| {
            SpecError::at(
                format!("files[{index}].src"),
                format!("{src:?} is not among the request's files: add it to `files` by that name"),
            )
        })?;
        check_size(index, src, contents.len() as u64)?;
        Ok(contents.clone())
    }
}

fn check_size(index: usize, what: &str, size: u64) -> Result<(), SpecError> {
    if size > MAX_FILE_BYTES {
        return Err(SpecError::at(
            format!("files[{index}].src"),
            format!("{what} is {size} bytes; a file may have at most {MAX_FILE_BYTES}"),
        ));
    }
    Ok(())
}

/// The cache key of a step of `kind` after `parent`, in a template with `env`.
pub fn step_key(parent: &str, kind: &StepKind, env: &std::collections::BTreeMap<String, String>) -> String {
    #[derive(Serialize)]
    struct Keyed<'a> {
        format: &'a str,
        parent: &'a str,
        step: &'a StepKind,
        command: &'a str,
        env: &'a std::collections::BTreeMap<String, String>,
    }
    // The command the step runs is part of its key: a new sandkasten that installs differently rebuilds.
    let command = command_of(kind);
    let keyed = Keyed { format: STEP_FORMAT, parent, step: kind, command: &command, env };
    sha256_hex(serde_json::to_string(&keyed).unwrap_or_default().as_bytes())
}

/// The steps of `spec`, whose `files` are read from `files`, after a base whose key is `parent` ([`base_key`]).
pub fn plan_steps(spec: &TemplateSpec, files: &dyn FileSource, parent: String) -> Result<Vec<BuildStep>, SpecError> {
    let mut kinds = Vec::new();
    for (packages, kind) in [
        (&spec.packages.apt, StepKind::Apt as fn(Vec<String>) -> StepKind),
        (&spec.packages.pip, StepKind::Pip),
        (&spec.packages.npm, StepKind::Npm),
    ] {
        if !packages.is_empty() {
            kinds.push(kind(packages.clone()));
        }
    }
    if !spec.files.is_empty() {
        let mut inputs = Vec::new();
        for (index, file) in spec.files.iter().enumerate() {
            let contents = files.read(index, &file.src)?;
            inputs.push(FileInput {
                dest: file.dest.clone(),
                mode: file.mode(),
                digest: sha256_hex(&contents),
                contents,
            });
        }
        kinds.push(StepKind::Files(inputs));
    }
    kinds.extend(spec.run.iter().cloned().map(StepKind::Run));
    let mut parent = parent;
    let mut steps = Vec::with_capacity(kinds.len());
    for (index, kind) in kinds.into_iter().enumerate() {
        let key = step_key(&parent, &kind, &spec.env);
        parent.clone_from(&key);
        steps.push(BuildStep { index, kind, key });
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(run: &[&str]) -> TemplateSpec {
        let mut spec =
            TemplateSpec::from_toml("name = \"t\"\nbase = \"host\"\n[packages]\npip = [\"tabulate==0.10.0\"]\n")
                .unwrap_or_else(|e| panic!("{e}"));
        spec.run = run.iter().map(|s| (*s).to_owned()).collect();
        spec
    }

    fn keys(spec: &TemplateSpec) -> Vec<String> {
        plan_steps(spec, &SpecDir(Path::new("/nonexistent")), base_key(&spec.base, None))
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .map(|s| s.key)
            .collect()
    }

    #[test]
    fn an_unchanged_spec_has_the_same_keys() {
        assert_eq!(keys(&spec(&["a", "b"])), keys(&spec(&["a", "b"])));
    }

    #[test]
    fn a_changed_step_changes_its_key_and_every_later_one_only() {
        let before = keys(&spec(&["a", "b", "c"]));
        let after = keys(&spec(&["a", "B", "c"]));
        assert_eq!(before[..2], after[..2], "pip and run[0] unchanged");
        assert_ne!(before[2], after[2]);
        assert_ne!(before[3], after[3], "a later step's parent changed");
    }

    #[test]
    fn env_and_file_contents_are_part_of_the_key() {
        let mut with_env = spec(&["a"]);
        with_env.env.insert("X".into(), "1".into());
        assert_ne!(keys(&spec(&["a"])), keys(&with_env));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("f"), "one").unwrap_or_else(|e| panic!("{e}"));
        let mut with_file = spec(&[]);
        with_file.files.push(crate::spec::FileSpec { src: "f".into(), dest: "/opt/f".into(), mode: None });
        let plan = |spec: &TemplateSpec| plan_steps(spec, &SpecDir(dir.path()), base_key(&spec.base, None));
        let first = plan(&with_file).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("f"), "two").unwrap_or_else(|e| panic!("{e}"));
        let second = plan(&with_file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(first[0].key, second[0].key);
        assert_ne!(first[1].key, second[1].key);
    }

    #[test]
    fn steps_come_in_order_packages_files_run() {
        let spec = spec(&["echo hi"]);
        let steps =
            plan_steps(&spec, &SpecDir(Path::new("/")), base_key(&spec.base, None)).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(steps[0].kind, StepKind::Pip(_)));
        assert!(steps[0].command().contains("/opt/sandkasten-venv/bin/pip install"), "{}", steps[0].command());
        assert_eq!(steps[1].title(), "run echo hi");
    }
}
