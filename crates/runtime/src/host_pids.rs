//! How many processes one sandbox may have on this host: a quarter of the kernel's `pid_max` (never more than the
//! 65,536 a spec may ask for), so that no single sandbox can take the PIDs the host and the other sandboxes need. A
//! spec asking for more is refused before anything exists, by the one-shot CLI and the server alike.

use crate::error::RuntimeError;

/// The most processes one sandbox may ask for here: `kernel.pid_max / 4`, at most `sandkasten_types::MAX_PIDS`.
pub fn sandbox_pids_cap() -> u64 {
    cap_for(pid_max())
}

fn pid_max() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        // The kernel's default on a host that does not say.
        .unwrap_or(32_768)
}

fn cap_for(pid_max: u64) -> u64 {
    (pid_max / 4).clamp(1, sandkasten_types::MAX_PIDS)
}

/// Why `pids` is more than one sandbox may have on this host, with the cap and where it comes from.
pub fn pids_refusal(pids: u64, cap: u64) -> String {
    format!(
        "pids {pids} is more than one sandbox may have on this host: at most {cap} (a quarter of kernel.pid_max = {}, \
         so the host keeps PIDs for itself and the other sandboxes); ask for fewer",
        pid_max()
    )
}

/// Refuses `pids` above this host's cap.
pub(crate) fn check_pids(pids: u64) -> Result<(), RuntimeError> {
    let cap = sandbox_pids_cap();
    if pids > cap {
        return Err(RuntimeError::InvalidInput(pids_refusal(pids, cap)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_a_quarter_of_pid_max_within_the_spec_range() {
        assert_eq!(cap_for(32_768), 8_192);
        assert_eq!(cap_for(4_194_304), sandkasten_types::MAX_PIDS);
        assert_eq!(cap_for(2), 1);
        assert!(check_pids(sandbox_pids_cap()).is_ok());
        let refused = check_pids(sandbox_pids_cap() + 1).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("kernel.pid_max") && refused.contains("ask for fewer"), "{refused}");
    }
}
