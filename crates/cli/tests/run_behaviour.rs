//! Programs behave inside as they do on a plain host: default signal actions, nothing blocked or ignored that the
//! owner (a Rust program, which ignores SIGPIPE) happened to have.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#[macro_use]
mod common;

use common::{Tier, assert_gone, code_on, run_on};

per_tier!(sigpipe_kills_a_writer_as_on_the_host, no_signal_is_ignored_or_blocked_in_the_program);

fn sigpipe_kills_a_writer_as_on_the_host(tier: Tier) {
    let result = run_on(tier, ["--", "bash", "-c", "yes | head -1 >/dev/null; echo ${PIPESTATUS[0]}"]).json();
    assert_eq!(result.stdout().trim(), "141", "yes must die of SIGPIPE (128+13): {}", result.describe());
    assert_gone(tier, &result.id());
}

fn no_signal_is_ignored_or_blocked_in_the_program(tier: Tier) {
    if tier == Tier::Gvisor {
        // gVisor's /proc/self/status has no SigBlk/SigIgn lines: a C program asks the kernel itself (Python cannot,
        // it ignores SIGPIPE and SIGXFSZ at start).
        let result = code_on(tier, "c", SIGNAL_STATE, &["--timeout", "20s"]).json();
        result.assert_exit(0);
        assert_eq!(result.stdout(), "checked\n", "{}", result.describe());
        assert_gone(tier, &result.id());
        return;
    }
    let result = run_on(tier, ["--", "grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"]).json();
    let stdout = result.stdout();
    assert!(stdout.contains("SigBlk:\t0000000000000000"), "{stdout}");
    assert!(stdout.contains("SigIgn:\t0000000000000000"), "{stdout}");
    assert_gone(tier, &result.id());
}

/// C that prints each blocked or ignored signal, then `checked`.
const SIGNAL_STATE: &str = "#include <signal.h>\n#include <stdio.h>\n\
    int main(void) {\n  sigset_t mask;\n  sigprocmask(SIG_BLOCK, NULL, &mask);\n\
      for (int s = 1; s < NSIG; s++) {\n    struct sigaction action;\n\
        if (sigismember(&mask, s) == 1) printf(\"blocked %d\\n\", s);\n\
        if (sigaction(s, NULL, &action) == 0 && action.sa_handler == SIG_IGN) printf(\"ignored %d\\n\", s);\n  }\n\
      puts(\"checked\");\n  return 0;\n}\n";
