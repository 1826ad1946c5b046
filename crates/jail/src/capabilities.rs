//! Capabilities: the sandboxed program keeps none, in any of the five sets.

#![allow(unsafe_code)]

use caps::CapSet;

use crate::error::JailError;

/// Empties the bounding and ambient sets; must run before switching to the unprivileged user (dropping the bounding
/// set needs CAP_SETPCAP, which the namespace root still has).
pub fn drop_bounding_and_ambient() -> Result<(), JailError> {
    let fail = |e: caps::errors::CapsError| JailError::Capabilities(e.to_string());
    if ambient_supported() {
        caps::clear(None, CapSet::Ambient).map_err(fail)?;
    }
    for cap in caps::all() {
        // A capability the kernel does not know (gVisor knows fewer than `caps::all()`) cannot be held: skip it.
        if known(cap) {
            caps::drop(None, CapSet::Bounding, cap).map_err(fail)?;
        }
    }
    Ok(())
}

/// Whether the kernel has ambient capabilities (gVisor answers `PR_CAP_AMBIENT` with EINVAL: it has none).
fn ambient_supported() -> bool {
    // SAFETY: prctl with integer arguments; PR_CAP_AMBIENT_IS_SET only reads.
    unsafe {
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_IS_SET as libc::c_ulong, 0 as libc::c_ulong, 0, 0) >= 0
    }
}

/// Whether the kernel knows `cap` (PR_CAPBSET_READ answers EINVAL for one it does not).
fn known(cap: caps::Capability) -> bool {
    // SAFETY: prctl with integer arguments; PR_CAPBSET_READ only reads.
    unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap.index() as libc::c_ulong, 0, 0, 0) >= 0 }
}

/// Empties the effective, permitted and inheritable sets, then checks that all five are empty.
pub fn drop_remaining_and_verify() -> Result<(), JailError> {
    let fail = |e: caps::errors::CapsError| JailError::Capabilities(e.to_string());
    for set in [CapSet::Effective, CapSet::Permitted, CapSet::Inheritable] {
        caps::clear(None, set).map_err(fail)?;
    }
    for set in [CapSet::Effective, CapSet::Permitted, CapSet::Inheritable, CapSet::Bounding, CapSet::Ambient] {
        if matches!(set, CapSet::Ambient) && !ambient_supported() {
            continue;
        }
        let held = if matches!(set, CapSet::Bounding) {
            caps::all()
                .into_iter()
                .filter(|cap| known(*cap) && caps::has_cap(None, set, *cap).unwrap_or(true))
                .collect()
        } else {
            caps::read(None, set).map_err(fail)?
        };
        if !held.is_empty() {
            return Err(JailError::Capabilities(format!("{set:?} set still holds {held:?}")));
        }
    }
    Ok(())
}
