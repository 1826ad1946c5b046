//! What a build reports as it goes, one event each: the CLI renders them (progress lines, or one JSON object per
//! line with `--json`), `POST /v1/templates` streams them as server-sent events, with the same shapes.

use sandkasten_template::TemplateRecord;
use sandkasten_types::{OutputChunk, StreamKind};
use serde::Serialize;

use crate::error::BuildError;

/// One event of a build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum BuildEvent {
    /// A step begins (`cached`: its layer comes from the cache and nothing runs).
    Step {
        /// 0-based position.
        index: usize,
        /// How many steps the build has.
        total: usize,
        /// e.g. `pip tabulate==0.10.0`, `run make`.
        title: String,
        /// The step's cache key.
        key: String,
        /// Whether the layer came from the cache.
        cached: bool,
        /// The cached layer's digest.
        layer: Option<String>,
    },
    /// Output of a running step (`step`: its index) or of `ready` (`step` null).
    Output {
        /// The step's index; null for `ready`.
        step: Option<usize>,
        /// `stdout` or `stderr`.
        #[cfg_attr(feature = "openapi", schema(value_type = String))]
        stream: StreamKind,
        /// The bytes, as UTF-8 (invalid sequences replaced).
        data: String,
    },
    /// A running step has downloaded `bytes` from the registries so far (through its egress proxy; sent when the
    /// count grew, at most four times a second, and once when the step ends).
    Download {
        /// The step's index.
        index: usize,
        /// Bytes received from the registries since the step began.
        bytes: u64,
    },
    /// A step ran and its layer was stored.
    Layer {
        /// 0-based position.
        index: usize,
        /// The step's title.
        title: String,
        /// The new layer's digest.
        layer: String,
    },
    /// The `ready` check passed.
    Ready {
        /// The command.
        command: String,
    },
    /// The template was made.
    Done {
        /// Its name.
        name: String,
        /// `sha256:` of its layers.
        digest: String,
        /// Its layers' digests, lowest first.
        layers: Vec<String>,
        /// Their size on disk, bytes.
        size_bytes: u64,
    },
    /// The build failed; no template was made.
    Failed {
        /// The template's name.
        name: String,
        /// Where: a step, `ready`, or `spec` (nothing ran).
        step: FailedAt,
        /// How, and how to fix it.
        message: String,
        /// The tail of the failing command's output.
        output: String,
    },
}

/// Where a build failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum FailedAt {
    /// A step.
    Step {
        /// 0-based position.
        index: usize,
        /// Its title.
        title: String,
    },
    /// Not a step: `ready` or `spec`.
    Phase(FailedPhase),
}

/// A part of a build that is not a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FailedPhase {
    /// The `ready` check.
    Ready,
    /// The spec (a field, or a base that is not built): nothing ran.
    Spec,
}

impl BuildEvent {
    /// The event's name (its `event` field): `step`, `output`, `download`, `layer`, `ready`, `done` or `failed`.
    pub fn name(&self) -> &'static str {
        match self {
            BuildEvent::Step { .. } => "step",
            BuildEvent::Output { .. } => "output",
            BuildEvent::Download { .. } => "download",
            BuildEvent::Layer { .. } => "layer",
            BuildEvent::Ready { .. } => "ready",
            BuildEvent::Done { .. } => "done",
            BuildEvent::Failed { .. } => "failed",
        }
    }

    /// The `output` event of `chunk` (`step`: `None` for `ready`).
    pub fn output(step: Option<usize>, chunk: &OutputChunk) -> BuildEvent {
        BuildEvent::Output { step, stream: chunk.stream, data: String::from_utf8_lossy(&chunk.data).into_owned() }
    }

    /// The last event of a build of `name`: `done`, or `failed` (`None` for an internal failure, which is no fault of
    /// the spec and is reported as an error instead).
    pub fn finished(name: &str, outcome: &Result<TemplateRecord, BuildError>) -> Option<BuildEvent> {
        match outcome {
            Ok(record) => Some(BuildEvent::Done {
                name: record.name.clone(),
                digest: record.digest.clone(),
                layers: record.layers.clone(),
                size_bytes: record.size_bytes,
            }),
            Err(BuildError::Failed { at, message, output }) => Some(BuildEvent::Failed {
                name: name.to_owned(),
                step: at.clone(),
                message: message.clone(),
                output: output.clone(),
            }),
            Err(BuildError::Spec(error)) => Some(BuildEvent::Failed {
                name: name.to_owned(),
                step: FailedAt::Phase(FailedPhase::Spec),
                message: error.to_string(),
                output: String::new(),
            }),
            Err(BuildError::Internal(_)) => None,
        }
    }
}
