//! Capabilities: the sandboxed program keeps none, in any of the five sets.

use caps::CapSet;

use crate::error::JailError;

/// Empties the bounding and ambient sets; must run before switching to the unprivileged user (dropping the bounding
/// set needs CAP_SETPCAP, which the namespace root still has).
pub fn drop_bounding_and_ambient() -> Result<(), JailError> {
    let fail = |e: caps::errors::CapsError| JailError::Capabilities(e.to_string());
    caps::clear(None, CapSet::Ambient).map_err(fail)?;
    for cap in caps::all() {
        caps::drop(None, CapSet::Bounding, cap).map_err(fail)?;
    }
    Ok(())
}

/// Empties the effective, permitted and inheritable sets, then checks that all five are empty.
pub fn drop_remaining_and_verify() -> Result<(), JailError> {
    let fail = |e: caps::errors::CapsError| JailError::Capabilities(e.to_string());
    for set in [CapSet::Effective, CapSet::Permitted, CapSet::Inheritable] {
        caps::clear(None, set).map_err(fail)?;
    }
    for set in [CapSet::Effective, CapSet::Permitted, CapSet::Inheritable, CapSet::Bounding, CapSet::Ambient] {
        let held = caps::read(None, set).map_err(fail)?;
        if !held.is_empty() {
            return Err(JailError::Capabilities(format!("{set:?} set still holds {held:?}")));
        }
    }
    Ok(())
}
