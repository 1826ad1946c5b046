//! The template spec (`template.toml`): what a template is built from, parsed with every unknown key refused and
//! validated so that each problem names its field and how to fix it.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::SpecError;

/// The directory a `host`-based template owns: everything it adds lives beneath it (the host's `/usr` stays the
/// host's, read-only).
pub const TEMPLATE_DIR: &str = "/opt";
/// The venv the `pip` packages go into (first on `PATH`).
pub const VENV_DIR: &str = "/opt/sandkasten-venv";
/// The global prefix of the `npm` packages (`lib/node_modules` on `NODE_PATH`, `bin` on `PATH`).
pub const NPM_PREFIX: &str = "/opt/sandkasten-npm";
/// The name of the sandbox user (uid 1000) when the spec gives none.
pub const DEFAULT_USER: &str = "sandbox";

/// A template: its base, what is installed and copied on top, and how its sandboxes start.
///
/// ```toml
/// name = "tables"
/// base = "host"
/// [packages]
/// pip = ["tabulate==0.10.0"]
/// [[files]]
/// src = "helper.py"
/// dest = "/opt/tables/helper.py"
/// mode = 0o644
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateSpec {
    /// The template's name: 1–63 characters of `a-z`, `0-9`, `-`, `_` and `.`, starting with a letter or digit.
    /// `host` and `e2b` are the built-in roots and cannot be taken.
    pub name: String,
    /// What the template starts from: `host` (the host's read-only `/usr`, a synthesised `/etc`),
    /// `debian:bookworm` or `debian:trixie` (a Debian root built with debootstrap), or the name of another template
    /// to extend.
    pub base: Base,
    /// Packages to install, by package manager.
    #[serde(default)]
    pub packages: Packages,
    /// Files copied in from next to the spec, in order.
    #[serde(default)]
    pub files: Vec<FileSpec>,
    /// Environment variables of the build's `run` steps and of every sandbox of the template (POSIX names).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory of the template's sandboxes (absolute). Default: the sandbox user's home.
    #[serde(default)]
    pub workdir: Option<String>,
    /// The name of the sandbox user (uid 1000, never root) in the template's `/etc/passwd`. Default `sandbox`.
    #[serde(default)]
    pub user: Option<String>,
    /// Build steps, each a shell command (`bash -c`) run in its own build sandbox after the packages and files;
    /// each makes one layer.
    #[serde(default)]
    pub run: Vec<String>,
    /// A shell command that must exit 0 in a sandbox of the finished template, or the template is not made.
    #[serde(default)]
    pub ready: Option<String>,
    /// Python modules a warm pool's zygote of this template may import ahead of time (e.g. `pandas`).
    #[serde(default)]
    pub preload: Vec<String>,
}

/// Packages to install.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Packages {
    /// Debian packages (Debian bases only), e.g. `["git", "gcc"]`.
    #[serde(default)]
    pub apt: Vec<String>,
    /// Python requirements as pip takes them, e.g. `["tabulate==0.10.0"]`: installed into one venv
    /// (`/opt/sandkasten-venv`) that is first on `PATH`.
    #[serde(default)]
    pub pip: Vec<String>,
    /// npm packages, e.g. `["left-pad@1.3.0"]`: installed globally under `/opt/sandkasten-npm`, on `NODE_PATH`.
    #[serde(default)]
    pub npm: Vec<String>,
}

/// One file copied into the template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    /// The file on the building host, relative to the spec's directory (no `..`).
    pub src: String,
    /// Where it goes in the template: an absolute path under `/opt` for a `host`-based template.
    pub dest: String,
    /// Permission bits, e.g. `0o755`. Default `0o644`.
    #[serde(default)]
    pub mode: Option<u32>,
}

impl FileSpec {
    /// The file's permission bits.
    pub fn mode(&self) -> u32 {
        self.mode.unwrap_or(0o644)
    }
}

/// What a template starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(try_from = "String", into = "String")]
#[schemars(with = "String")]
pub enum Base {
    /// The host's read-only `/usr` and a synthesised `/etc`.
    Host,
    /// A Debian root of this suite, built with debootstrap.
    Debian(DebianSuite),
    /// Another template, extended.
    Template(String),
}

/// The Debian suites a template may start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DebianSuite {
    /// Debian 12.
    Bookworm,
    /// Debian 13.
    Trixie,
}

impl DebianSuite {
    /// The suite's name in Debian's archive.
    pub fn name(self) -> &'static str {
        match self {
            DebianSuite::Bookworm => "bookworm",
            DebianSuite::Trixie => "trixie",
        }
    }
}

impl TryFrom<String> for Base {
    type Error = String;

    fn try_from(text: String) -> Result<Base, String> {
        match text.as_str() {
            "host" => Ok(Base::Host),
            "debian:bookworm" => Ok(Base::Debian(DebianSuite::Bookworm)),
            "debian:trixie" => Ok(Base::Debian(DebianSuite::Trixie)),
            other if other.starts_with("debian") => {
                Err(format!("unknown Debian base {other:?}: use \"debian:bookworm\" or \"debian:trixie\""))
            }
            other => match check_name(other) {
                Ok(()) => Ok(Base::Template(other.to_owned())),
                Err(reason) => Err(format!(
                    "base {other:?} is neither \"host\", \"debian:bookworm\", \"debian:trixie\" nor a template name \
                     ({reason})"
                )),
            },
        }
    }
}

impl From<Base> for String {
    fn from(base: Base) -> String {
        base.to_string()
    }
}

impl std::fmt::Display for Base {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Base::Host => f.write_str("host"),
            Base::Debian(suite) => write!(f, "debian:{}", suite.name()),
            Base::Template(name) => f.write_str(name),
        }
    }
}

/// Names a template cannot take: the built-in roots.
pub const RESERVED_NAMES: &[&str] = &["host", "e2b"];

/// Whether `name` is a valid template name (see [`TemplateSpec::name`]); the reason when not.
pub fn check_name(name: &str) -> Result<(), String> {
    let valid_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > 63 {
        return Err("a name has 1 to 63 characters".to_owned());
    }
    if !name.chars().all(valid_char) || !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("use a-z, 0-9, '-', '_' and '.', starting with a letter or digit".to_owned());
    }
    Ok(())
}

impl TemplateSpec {
    /// Parses and validates a spec's TOML text.
    pub fn from_toml(text: &str) -> Result<TemplateSpec, SpecError> {
        let deserializer = toml::de::Deserializer::parse(text).map_err(|error| SpecError::toml(text, "", &error))?;
        let spec: TemplateSpec = serde_path_to_error::deserialize(deserializer).map_err(|error| {
            let path = error.path().to_string();
            SpecError::toml(text, if path == "." { "" } else { &path }, error.inner())
        })?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parses and validates a spec given as JSON (the API's): the same fields as the TOML, every problem named by
    /// its field's path.
    pub fn from_json(value: serde_json::Value) -> Result<TemplateSpec, SpecError> {
        let spec: TemplateSpec = serde_path_to_error::deserialize(value).map_err(|error| {
            let path = error.path().to_string();
            let mut message = error.inner().to_string();
            if message.starts_with("unknown field") {
                message.push_str(": remove the key or fix its spelling");
            }
            SpecError::at(if path == "." { "spec".to_owned() } else { path }, message)
        })?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks what the types cannot: names, paths, modes, package names, which base offers what.
    pub fn validate(&self) -> Result<(), SpecError> {
        check_name(&self.name).map_err(|reason| SpecError::at("name", reason))?;
        if RESERVED_NAMES.contains(&self.name.as_str()) {
            return Err(SpecError::at("name", format!("{:?} is a built-in root: choose another name", self.name)));
        }
        if self.base == Base::Template(self.name.clone()) {
            return Err(SpecError::at("base", "a template cannot extend itself: name another template"));
        }
        for (list, packages) in [("apt", &self.packages.apt), ("pip", &self.packages.pip), ("npm", &self.packages.npm)]
        {
            for (index, package) in packages.iter().enumerate() {
                check_package(package).map_err(|reason| SpecError::at(format!("packages.{list}[{index}]"), reason))?;
            }
        }
        self.check_on_root(&self.base)?;
        for name in self.env.keys() {
            if !is_env_name(name) {
                return Err(SpecError::at(
                    format!("env.{name}"),
                    "not a POSIX variable name: use letters, digits and '_', not starting with a digit",
                ));
            }
        }
        if let Some(workdir) = &self.workdir
            && !is_clean_absolute(workdir)
        {
            return Err(SpecError::at("workdir", "must be an absolute path without '..', e.g. \"/opt/app\""));
        }
        if let Some(user) = &self.user {
            check_user(user).map_err(|reason| SpecError::at("user", reason))?;
        }
        for (index, command) in self.run.iter().enumerate() {
            if command.trim().is_empty() {
                return Err(SpecError::at(format!("run[{index}]"), "an empty command: remove it or write one"));
            }
        }
        if self.ready.as_deref().is_some_and(|ready| ready.trim().is_empty()) {
            return Err(SpecError::at("ready", "an empty command: remove `ready` or write a check"));
        }
        for (index, module) in self.preload.iter().enumerate() {
            if !is_module_name(module) {
                return Err(SpecError::at(format!("preload[{index}]"), "not a Python module name, e.g. \"pandas\""));
            }
        }
        Ok(())
    }

    /// Checks what depends on the root the template's layers end on (`host` or a Debian suite; for a template base
    /// its base's root): apt needs Debian, a host-rooted template adds files under `/opt` only.
    pub fn check_on_root(&self, root: &Base) -> Result<(), SpecError> {
        if *root == Base::Host && !self.packages.apt.is_empty() {
            return Err(SpecError::at(
                "packages.apt",
                "apt packages need a Debian base: set base = \"debian:bookworm\" (the host's /usr is read-only)",
            ));
        }
        for (index, file) in self.files.iter().enumerate() {
            check_file(file, root).map_err(|(key, reason)| SpecError::at(format!("files[{index}].{key}"), reason))?;
        }
        Ok(())
    }

    /// The sandbox user's name.
    pub fn user_name(&self) -> &str {
        self.user.as_deref().unwrap_or(DEFAULT_USER)
    }
}

/// A package argument must be one word that no package manager reads as an option.
fn check_package(package: &str) -> Result<(), String> {
    if package.is_empty() || package.starts_with('-') || package.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{package:?} is not a package: one name (with an optional version), no spaces or options"));
    }
    Ok(())
}

fn check_file(file: &FileSpec, base: &Base) -> Result<(), (&'static str, String)> {
    let src = Path::new(&file.src);
    if file.src.is_empty() || src.is_absolute() || !src.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(("src", "must be a path relative to the spec's directory, without '..'".to_owned()));
    }
    if !is_clean_absolute(&file.dest) {
        return Err(("dest", "must be an absolute path without '..'".to_owned()));
    }
    let under_template_dir =
        Path::new(&file.dest).strip_prefix(TEMPLATE_DIR).is_ok_and(|rest| !rest.as_os_str().is_empty());
    if *base == Base::Host && !under_template_dir {
        return Err((
            "dest",
            format!(
                "a host-based template adds files under {TEMPLATE_DIR} only, e.g. \"{TEMPLATE_DIR}/app/{}\"",
                file.src
            ),
        ));
    }
    if file.mode.is_some_and(|mode| mode & !0o777 != 0) {
        return Err(("mode", "permission bits only (0o000 to 0o777), e.g. 0o755".to_owned()));
    }
    Ok(())
}

use sandkasten_types::check_user_name as check_user;

/// Whether `name` is a POSIX environment variable name.
pub fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `name` is a Python module's dotted name (`pandas`, `os.path`): what a zygote may `import`.
pub fn is_module_name(name: &str) -> bool {
    (1..=255).contains(&name.len())
        && name.split('.').all(|part| {
            part.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
}

/// Whether `path` is absolute with no `.` or `..` component.
pub fn is_clean_absolute(path: &str) -> bool {
    let path = Path::new(path);
    path.is_absolute() && path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// The JSON schema (draft 2020-12) of a template spec, committed as `docs/template.schema.json`.
pub fn json_schema() -> serde_json::Value {
    schemars::generate::SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<TemplateSpec>()
        .to_value()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(text: &str) -> String {
        match TemplateSpec::from_toml(text) {
            Ok(spec) => panic!("accepted: {spec:?}"),
            Err(error) => error.field().unwrap_or_default().to_owned() + " | " + &error.to_string(),
        }
    }

    #[test]
    fn a_full_spec_parses() {
        let spec = TemplateSpec::from_toml(
            "name = \"tables\"\nbase = \"host\"\nrun = [\"echo hi\"]\nready = \"python3 -c 'import tabulate'\"\n\
             preload = [\"tabulate\"]\nworkdir = \"/opt/app\"\nuser = \"user\"\n[env]\nA = \"b\"\n\
             [packages]\npip = [\"tabulate==0.10.0\"]\nnpm = [\"left-pad@1.3.0\"]\n\
             [[files]]\nsrc = \"a.py\"\ndest = \"/opt/app/a.py\"\nmode = 0o755\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spec.base, Base::Host);
        assert_eq!(spec.files[0].mode(), 0o755);
        assert_eq!(spec.user_name(), "user");
    }

    #[test]
    fn bases_are_parsed_and_unknown_ones_named() {
        let base = |text: &str| Base::try_from(text.to_owned());
        assert_eq!(base("debian:trixie"), Ok(Base::Debian(DebianSuite::Trixie)));
        assert_eq!(base("tables"), Ok(Base::Template("tables".into())));
        assert!(base("debian:sid").is_err_and(|e| e.contains("bookworm")));
        assert!(base("Not A Name").is_err());
    }

    #[test]
    fn unknown_keys_wrong_types_and_missing_base_name_the_field() {
        let unknown = field_of("name = \"a\"\nbase = \"host\"\nrn = [\"x\"]\n");
        assert!(unknown.contains("rn") && unknown.contains("line 3"), "{unknown}");
        let nested = field_of("name = \"a\"\nbase = \"host\"\n[packages]\npipp = [\"x\"]\n");
        assert!(nested.starts_with("packages") && nested.contains("pipp"), "{nested}");
        let wrong = field_of("name = \"a\"\nbase = \"host\"\nrun = \"echo\"\n");
        assert!(wrong.starts_with("run |") && wrong.contains("expected a sequence"), "{wrong}");
        let missing = field_of("name = \"a\"\n");
        assert!(missing.contains("missing field `base`"), "{missing}");
    }

    #[test]
    fn semantic_problems_name_the_field_and_the_fix() {
        let cases = [
            ("name = \"host\"\nbase = \"host\"", "name"),
            ("name = \"a\"\nbase = \"host\"\n[packages]\napt = [\"git\"]", "packages.apt"),
            ("name = \"a\"\nbase = \"host\"\n[packages]\npip = [\"--index-url=x\"]", "packages.pip[0]"),
            ("name = \"a\"\nbase = \"host\"\n[[files]]\nsrc = \"../x\"\ndest = \"/opt/x\"", "files[0].src"),
            ("name = \"a\"\nbase = \"host\"\n[[files]]\nsrc = \"x\"\ndest = \"/usr/x\"", "files[0].dest"),
            (
                "name = \"a\"\nbase = \"host\"\n[[files]]\nsrc = \"x\"\ndest = \"/opt/x\"\nmode = 0o4755",
                "files[0].mode",
            ),
            ("name = \"a\"\nbase = \"host\"\nuser = \"root\"", "user"),
            ("name = \"a\"\nbase = \"a\"", "base"),
            ("name = \"a\"\nbase = \"host\"\nworkdir = \"rel\"", "workdir"),
            ("name = \"a\"\nbase = \"host\"\n[env]\n\"1X\" = \"v\"", "env.1X"),
        ];
        for (text, field) in cases {
            let found = field_of(text);
            assert!(found.starts_with(&format!("{field} |")), "{text}: {found}");
        }
    }

    #[test]
    fn a_json_spec_names_the_field_of_its_problem() {
        let error = |value: serde_json::Value| TemplateSpec::from_json(value).err().map(|e| e.to_string());
        let unknown = error(serde_json::json!({"name": "a", "base": "host", "packages": {"pipp": []}}));
        assert!(
            unknown.as_deref().is_some_and(|e| e.starts_with("packages.pipp: unknown field `pipp`")),
            "{unknown:?}"
        );
        let wrong = error(serde_json::json!({"name": "a", "base": "host", "run": "echo"}));
        assert!(wrong.as_deref().is_some_and(|e| e.starts_with("run: invalid type")), "{wrong:?}");
        let semantic = error(serde_json::json!({"name": "host", "base": "host"}));
        assert!(semantic.as_deref().is_some_and(|e| e.starts_with("name: ")), "{semantic:?}");
        let spec = TemplateSpec::from_json(serde_json::json!({"name": "a", "base": "host", "run": ["true"]}));
        assert!(spec.is_ok_and(|spec| spec.run == ["true"]));
    }

    #[test]
    fn the_schema_refuses_unknown_keys_and_describes_fields() {
        let schema = json_schema();
        assert_eq!(schema["additionalProperties"], false);
        assert!(schema["properties"]["base"]["description"].is_string());
        assert_eq!(schema["required"], serde_json::json!(["name", "base"]));
    }
}
