//! The CLI's exit codes. A program's own exit code passes through; these are reserved for what sandkasten reports.
//! (A program that itself exits with one of them is indistinguishable in plain mode: use `--json` to be sure.)

use sandkasten_types::{ErrorCode, ExecResult, LimitKind};

/// Bad input or an unsupported host: nothing was created.
pub const BAD_INPUT: i32 = 2;
/// The output limit was exceeded; the sandbox was stopped.
pub const OUTPUT_LIMIT: i32 = 121;
/// The memory limit was reached; the kernel OOM-killed a process.
pub const MEMORY_LIMIT: i32 = 122;
/// The C source did not compile.
pub const COMPILE_ERROR: i32 = 123;
/// The wall-clock timeout fired (as timeout(1)).
pub const TIMEOUT: i32 = 124;
/// sandkasten itself failed.
pub const SANDBOX_ERROR: i32 = 125;

/// The exit code for a result.
pub fn for_result(result: &ExecResult) -> i32 {
    match (&result.error, result.limit) {
        (Some(error), _) if error.code == ErrorCode::CompileError => COMPILE_ERROR,
        (Some(error), _) if error.code == ErrorCode::SandboxError => SANDBOX_ERROR,
        (_, Some(LimitKind::Time)) => TIMEOUT,
        (_, Some(LimitKind::Output)) => OUTPUT_LIMIT,
        (_, Some(LimitKind::Memory)) => MEMORY_LIMIT,
        _ => match (result.exit_code, result.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => SANDBOX_ERROR,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandkasten_types::ErrorInfo;

    #[test]
    fn limits_and_errors_map_to_reserved_codes() {
        let mut result = ExecResult { exit_code: Some(3), ..ExecResult::default() };
        assert_eq!(for_result(&result), 3);
        result.limit = Some(LimitKind::Time);
        assert_eq!(for_result(&result), TIMEOUT);
        result.error = Some(ErrorInfo::new(ErrorCode::CompileError, "x"));
        assert_eq!(for_result(&result), COMPILE_ERROR);
        let signalled = ExecResult { signal: Some(9), ..ExecResult::default() };
        assert_eq!(for_result(&signalled), 137);
        let disk = ExecResult { exit_code: Some(1), limit: Some(LimitKind::Disk), ..ExecResult::default() };
        assert_eq!(for_result(&disk), 1);
    }
}
