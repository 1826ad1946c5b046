//! The agent is a forked copy of its owner (the CLI or the server), so its memory still holds the owner's argv and
//! environment, which `/proc/1/cmdline` and `/proc/1/environ` expose. The program cannot read `environ` across uids,
//! but `cmdline` is world-readable: both are wiped before anything of the caller's runs.

#![allow(unsafe_code)]

/// Zeroes the argument and environment areas of this process (as recorded by the kernel in `/proc/self/stat`).
pub fn wipe_inherited_argv_and_environment() {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return };
    // Fields after the command name (which may contain spaces) start after the last ')'; field 3 is index 0 here.
    let Some(after_name) = stat.rfind(')').map(|at| &stat[at + 1..]) else { return };
    let fields: Vec<u64> = after_name.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
    // arg_start, arg_end, env_start, env_end are fields 48..=51 (1-based) → indices 45..=48.
    let (Some(&arg_start), Some(&arg_end), Some(&env_start), Some(&env_end)) =
        (fields.get(45), fields.get(46), fields.get(47), fields.get(48))
    else {
        return;
    };
    for (start, end) in [(arg_start, arg_end), (env_start, env_end)] {
        if start == 0 || end <= start {
            continue;
        }
        // SAFETY: the kernel reports these ranges as this process's own argv/environment strings, which live in its
        // writable stack mapping for the whole life of the process. The agent is single-threaded and uses neither
        // argv nor the environment from here on (clearenv below drops the pointers into the zeroed area).
        unsafe { std::ptr::write_bytes(start as usize as *mut u8, 0, (end - start) as usize) };
    }
    // SAFETY: single-threaded; clearenv only resets libc's environ pointer.
    unsafe { libc::clearenv() };
}
