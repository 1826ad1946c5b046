//! Programs behave inside as they do on a plain host: default signal actions, nothing blocked or ignored that the
//! owner (a Rust program, which ignores SIGPIPE) happened to have.

#[macro_use]
mod common;

use common::{assert_no_leaks, run};

#[test]
fn sigpipe_kills_a_writer_as_on_the_host() {
    require_root!();
    let result = run(["--", "bash", "-c", "yes | head -1 >/dev/null; echo ${PIPESTATUS[0]}"]).json();
    assert_eq!(result.stdout().trim(), "141", "yes must die of SIGPIPE (128+13): {}", result.describe());
    assert_no_leaks(&result.id());
}

#[test]
fn no_signal_is_ignored_or_blocked_in_the_program() {
    require_root!();
    let result = run(["--", "grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"]).json();
    let stdout = result.stdout();
    assert!(stdout.contains("SigBlk:\t0000000000000000"), "{stdout}");
    assert!(stdout.contains("SigIgn:\t0000000000000000"), "{stdout}");
    assert_no_leaks(&result.id());
}
