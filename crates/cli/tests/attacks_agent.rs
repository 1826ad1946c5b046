//! Attacks on the sandbox's agent (PID 1 inside): it is a forked copy of the CLI, so its memory starts with the CLI's
//! argv and environment; none of that may be readable from inside, and the agent must not be killable or traceable.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#[macro_use]
mod common;

use common::{Tier, assert_gone, host_file, run_on, unique_token};

per_tier!(agent_cmdline_and_environ_do_not_reveal_the_owner, agent_cannot_be_killed_or_traced_from_inside,);

fn agent_cmdline_and_environ_do_not_reveal_the_owner(tier: Tier) {
    let token = unique_token("sk-owner-secret-");
    let (_dir, upload) = host_file(&format!("{token}.txt"), b"data");
    let upload_arg = format!("{}:in.txt", upload.display());
    let script = "tr '\\0' ' ' < /proc/1/cmdline; echo; tr '\\0' ' ' < /proc/1/environ 2>&1; echo; \
                  ls -l /proc/1/exe 2>&1; echo; cat in.txt";
    let result = run_on(tier, ["--upload", upload_arg.as_str(), "--env", "VISIBLE=1", "--", "sh", "-c", script])
        .env("SANDKASTEN_TEST_OWNER_SECRET", &token)
        .json();
    let stdout = result.stdout();
    // Positive control: the upload arrived, so the token really was on the CLI's command line.
    assert!(stdout.ends_with("data"), "the upload must be readable inside: {stdout}");
    assert!(!stdout.contains(&token), "the owner's argv or environment leaked into the sandbox:\n{stdout}");
    assert!(!stdout.contains("sandkasten run"), "the agent's cmdline still shows the CLI's arguments:\n{stdout}");
    assert_gone(tier, &result.id());
}

fn agent_cannot_be_killed_or_traced_from_inside(tier: Tier) {
    let code = [
        "import ctypes, os, signal",
        "libc = ctypes.CDLL(None, use_errno=True)",
        "for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):",
        "    try:",
        "        os.kill(1, sig)",
        "        print('kill', int(sig), 'ok')",
        "    except OSError as e:",
        "        print('kill', int(sig), 'errno', e.errno)",
        "print('ptrace', libc.ptrace(16, 1, 0, 0), ctypes.get_errno())",
        "print('alive')",
    ]
    .join("\n");
    let result = run_on(tier, ["--lang", "python", "--code", code.as_str()]).json();
    let stdout = result.stdout();
    assert!(stdout.contains("alive"), "the program must run to the end: {stdout}");
    assert!(!stdout.contains(" ok"), "a signal reached the agent: {stdout}");
    assert!(stdout.contains("ptrace -1 1"), "PTRACE_ATTACH to the agent must fail with EPERM: {stdout}");
    assert_eq!(result.json["exit_code"], 0, "the agent reported the program's exit normally");
    assert_gone(tier, &result.id());
}
