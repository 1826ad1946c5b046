//! Sandbox templates (issue #16): the spec ([`spec`], TOML; [`dockerfile`], a Dockerfile subset translated to the same
//! spec), the ordered build steps it becomes with their cache keys ([`steps`]), layers packed as tar with OCI
//! whiteouts ([`layer`]), the local cache of layers and finished templates ([`cache`]), and the package registries a
//! build may reach ([`registries`]). Running the steps in build sandboxes is the CLI's (`sandkasten template build`).

pub mod cache;
pub mod dockerfile;
pub mod error;
pub mod layer;
pub mod registries;
pub mod spec;
pub mod steps;

pub use cache::{GcReport, TemplateCache, TemplateRecord};
pub use error::{CacheError, SpecError};
pub use spec::{Base, TemplateSpec};
pub use steps::{BuildStep, StepKind};

/// Reads a spec file: a Dockerfile (named `Dockerfile` or `*.Dockerfile`) is translated, with the template named
/// after `name` or else its directory; anything else is TOML.
pub fn read_spec(path: &std::path::Path, name: Option<&str>) -> Result<TemplateSpec, SpecError> {
    let text = std::fs::read_to_string(path).map_err(|source| SpecError::Read { path: path.to_path_buf(), source })?;
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if file_name == "Dockerfile" || file_name.ends_with(".Dockerfile") {
        let directory = std::fs::canonicalize(path)
            .ok()
            .and_then(|p| p.parent().and_then(|d| d.file_name()).map(|n| n.to_string_lossy().to_lowercase()));
        let name = name.map(str::to_owned).or(directory).unwrap_or_else(|| "dockerfile".to_owned());
        return dockerfile::translate(&text, &name);
    }
    let mut spec = TemplateSpec::from_toml(&text)?;
    if let Some(name) = name {
        name.clone_into(&mut spec.name);
        spec.validate()?;
    }
    Ok(spec)
}
