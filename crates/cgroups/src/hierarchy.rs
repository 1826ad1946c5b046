//! A host cgroup hierarchy (v1: a mount per controller; v2: one unified root) and the operations that
//! make, find and list cgroups in it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::cgroup::Cgroup;
use crate::error::CgroupError;
use crate::limits::CgroupLimits;
use crate::{CgroupVersion, fsops, sys, v1, v2};

/// A detected (or given) host cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    layout: Layout,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    V1 { controllers: BTreeMap<String, PathBuf> },
    V2 { root: PathBuf },
}

impl Hierarchy {
    /// A v1 hierarchy with each controller mounted at the given path (co-mounted controllers map to the
    /// same path).
    pub fn v1_at(controllers: BTreeMap<String, PathBuf>) -> Hierarchy {
        Hierarchy { layout: Layout::V1 { controllers } }
    }

    /// A v2 hierarchy rooted at `root` (a cgroup2 mount or a delegated subtree of one).
    pub fn v2_at(root: PathBuf) -> Hierarchy {
        Hierarchy { layout: Layout::V2 { root } }
    }

    /// Which cgroup version this is.
    pub fn version(&self) -> CgroupVersion {
        match self.layout {
            Layout::V1 { .. } => CgroupVersion::V1,
            Layout::V2 { .. } => CgroupVersion::V2,
        }
    }

    /// One line for `doctor`: version, mount(s), and which needed controllers are available and writable.
    pub fn describe(&self) -> String {
        let access = |path: &Path| {
            if !path.is_dir() {
                "absent"
            } else if sys::is_writable(path) {
                "writable"
            } else {
                "read-only"
            }
        };
        match &self.layout {
            Layout::V1 { controllers } => {
                let mut line = String::from("cgroup v1:");
                let mut missing = Vec::new();
                for controller in v1::CONTROLLERS {
                    match controllers.get(controller) {
                        Some(path) => {
                            let _ = write!(line, " {controller}={} ({})", path.display(), access(path));
                        }
                        None => missing.push(controller),
                    }
                }
                let _ = write!(line, "; missing: {}", join_or_none(&missing));
                line
            }
            Layout::V2 { root } => {
                let have = fsops::read_words(&root.join("cgroup.controllers")).unwrap_or_default();
                let (available, missing): (Vec<&str>, Vec<&str>) =
                    v2::CONTROLLERS.into_iter().partition(|c| have.contains(*c));
                format!(
                    "cgroup v2 at {} ({}): available: {}; missing: {}",
                    root.display(),
                    access(root),
                    join_or_none(&available),
                    join_or_none(&missing)
                )
            }
        }
    }

    /// Creates `<root>/<parent>/<name>` in every needed controller, enables controllers (v2, best effort:
    /// see `Cgroup::missing_controllers`) and applies `limits`. A limit whose controller is missing is an
    /// error (limits are never silently dropped). On failure half way, removes what it created.
    /// `parent` is a relative `/`-separated path (may be empty); `name` is one component.
    pub fn create(&self, parent: &str, name: &str, limits: &CgroupLimits) -> Result<Cgroup, CgroupError> {
        let (parent_rel, full_rel) = fsops::relative_paths(parent, name)?;
        match &self.layout {
            Layout::V1 { controllers } => v1::create(controllers, &parent_rel, &full_rel, name, limits),
            Layout::V2 { root } => v2::create(root, &parent_rel, &full_rel, name, limits),
        }
    }

    /// Opens an existing cgroup by name (for garbage collection of a crashed run); `Ok(None)` if no
    /// controller has it.
    pub fn open(&self, parent: &str, name: &str) -> Result<Option<Cgroup>, CgroupError> {
        let (_, full_rel) = fsops::relative_paths(parent, name)?;
        match &self.layout {
            Layout::V1 { controllers } => Ok(v1::open(controllers, &full_rel, name)),
            Layout::V2 { root } => v2::open(root, &full_rel, name),
        }
    }

    /// Names of all cgroups directly under `parent` in any needed controller, sorted (for gc).
    pub fn list(&self, parent: &str) -> Result<Vec<String>, CgroupError> {
        let parent_rel = fsops::relative_parent(parent)?;
        let names = match &self.layout {
            Layout::V1 { controllers } => v1::list(controllers, &parent_rel)?,
            Layout::V2 { root } => fsops::subdirs(&root.join(&parent_rel))?,
        };
        Ok(names.into_iter().collect())
    }

    /// Removes the (empty) parent directory `parent` in every controller; fine if already gone. Fails at once with
    /// `RemoveDir` while cgroups remain under it (no waiting: other sandboxes may live there for hours).
    pub fn remove_parent(&self, parent: &str) -> Result<(), CgroupError> {
        let parent_rel = fsops::relative_parent(parent)?;
        if parent_rel.as_os_str().is_empty() {
            return Err(CgroupError::InvalidName { name: parent.to_owned(), reason: "the root cannot be removed" });
        }
        match &self.layout {
            Layout::V1 { controllers } => {
                let mounts: BTreeMap<String, PathBuf> = v1::CONTROLLERS
                    .iter()
                    .filter_map(|c| controllers.get(*c).map(|m| ((*c).to_owned(), m.join(&parent_rel))))
                    .collect();
                for dir in v1::unique_dirs(&mounts) {
                    fsops::remove_dir_once(&dir)?;
                }
                Ok(())
            }
            Layout::V2 { root } => fsops::remove_dir_once(&root.join(parent_rel)),
        }
    }
}

/// `a b c`, or `none` for an empty list.
fn join_or_none(items: &[&str]) -> String {
    if items.is_empty() { "none".to_owned() } else { items.join(" ") }
}
