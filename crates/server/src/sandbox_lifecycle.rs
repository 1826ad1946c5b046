//! A sandbox's lifecycle settings (`lifecycle` in `POST /v1/sandboxes`): what happens at its timeout and to requests
//! while it is paused. Stored with the sandbox (`lifecycle_json`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What happens to a sandbox at its timeout, and to requests while it is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Lifecycle {
    /// At its timeout the sandbox is paused instead of destroyed (it stays until deleted or resumed).
    pub auto_pause: bool,
    /// A request to the sandbox while it is paused resumes it first (instead of answering 409 `paused`).
    pub auto_resume: bool,
}
