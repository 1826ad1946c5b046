//! Functional tests of `sandkasten run`: each language, code sources (--code, --file, stdin, raw command), stdin
//! forwarding, uploads, env, exact binary output, identity inside the sandbox, exit codes in plain and JSON mode.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use common::*;

per_tier!(
    python_hello_world_runs,
    node_hello_world_runs,
    bash_hello_world_runs,
    c_hello_world_compiles_and_runs,
    exit_codes_are_propagated_in_json_and_plain_mode,
    plain_mode_streams_stdout_and_stderr_separately,
    killed_by_signal_reports_signal_and_128_plus_n,
    c_compile_error_is_reported_with_gcc_message,
    raw_command_runs_absolute_and_via_path,
    raw_command_not_found_is_exec_failed,
    file_flag_runs_the_file,
    code_from_stdin_runs_with_empty_program_stdin,
    program_stdin_is_forwarded,
    upload_is_visible_inside,
    env_flag_is_visible_and_nothing_else,
    non_utf8_output_is_kept_exactly_in_base64,
    utf8_output_has_no_base64_field,
    identity_is_sandbox_user_in_workspace,
    code_file_is_read_only_under_sandbox_dir,
    json_result_has_documented_fields,
    sandbox_ids_are_unique_per_run,
);

fn hello(tier: Tier, lang: &str, code: &str, expected: &str) {
    let r = code_on(tier, lang, code, &[]).json();
    r.assert_exit(0);
    assert_eq!(r.cli_code(), 0, "{}", r.describe());
    assert_eq!(r.stdout(), expected, "{}", r.describe());
    assert!(r.json["error"].is_null(), "{}", r.describe());
    assert_eq!(r.limit(), None, "{}", r.describe());
    assert!(!r.flag("timed_out") && !r.flag("oom_killed"), "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn python_hello_world_runs(tier: Tier) {
    hello(tier, "python", "print(2+2)", "4\n");
}

fn node_hello_world_runs(tier: Tier) {
    hello(tier, "node", "console.log(6*7)", "42\n");
}

fn bash_hello_world_runs(tier: Tier) {
    hello(tier, "bash", "echo hello from bash", "hello from bash\n");
}

fn c_hello_world_compiles_and_runs(tier: Tier) {
    hello(tier, "c", "#include <stdio.h>\nint main(void){printf(\"hello from c\\n\");return 0;}\n", "hello from c\n");
}

fn exit_codes_are_propagated_in_json_and_plain_mode(tier: Tier) {
    let cases = [
        ("python", "import sys; sys.exit(7)", 7),
        ("node", "process.exit(9)", 9),
        ("bash", "exit 3", 3),
        ("c", "int main(void){return 5;}", 5),
    ];
    for (lang, code, expected) in cases {
        let r = code_on(tier, lang, code, &[]).json();
        r.assert_exit(expected);
        assert_eq!(r.cli_code(), expected as i32, "{lang}: --json exits with the program's code\n{}", r.describe());
        assert_gone(tier, &r.id());
        let plain = code_on(tier, lang, code, &[]).output();
        assert_eq!(plain.code, expected as i32, "{lang} plain mode\n{}", plain.describe());
    }
}

fn plain_mode_streams_stdout_and_stderr_separately(tier: Tier) {
    let out = code_on(tier, "bash", "echo to-out; echo to-err >&2; exit 4", &[]).output();
    assert_eq!(out.code, 4, "{}", out.describe());
    assert_eq!(out.stdout_text(), "to-out\n", "{}", out.describe());
    assert!(out.stderr_text().contains("to-err"), "{}", out.describe());
    assert!(!out.stdout_text().contains("to-err"), "{}", out.describe());
}

fn killed_by_signal_reports_signal_and_128_plus_n(tier: Tier) {
    let r = code_on(tier, "bash", "kill -TERM $$; sleep 5", &[]).json();
    assert_eq!(r.signal(), Some(15), "{}", r.describe());
    assert_eq!(r.exit_code(), None, "exit_code is null when killed by a signal\n{}", r.describe());
    assert_eq!(r.cli_code(), 128 + 15, "{}", r.describe());
    assert_gone(tier, &r.id());
    let plain = code_on(tier, "bash", "kill -TERM $$; sleep 5", &[]).output();
    assert_eq!(plain.code, 143, "{}", plain.describe());
}

fn c_compile_error_is_reported_with_gcc_message(tier: Tier) {
    let r = code_on(tier, "c", "int main(void){ this is not c; }", &[]).json();
    assert_eq!(r.cli_code(), 123, "{}", r.describe());
    assert_eq!(r.error_code().as_deref(), Some("compile_error"), "{}", r.describe());
    assert!(r.stderr().contains("error"), "gcc's message is in stderr\n{}", r.describe());
    assert!(r.stdout().is_empty(), "{}", r.describe());
    assert_gone(tier, &r.id());
    let plain = code_on(tier, "c", "int main(void){ this is not c; }", &[]).output();
    assert_eq!(plain.code, 123, "{}", plain.describe());
    assert!(plain.stderr_text().contains("error"), "{}", plain.describe());
}

fn raw_command_runs_absolute_and_via_path(tier: Tier) {
    let r = run_on(tier, ["--", "/bin/echo", "hi"]).json();
    r.assert_exit(0);
    assert_eq!(r.stdout(), "hi\n", "{}", r.describe());
    assert_gone(tier, &r.id());
    let r = run_on(tier, ["--", "echo", "via", "path"]).json();
    r.assert_exit(0);
    assert_eq!(r.stdout(), "via path\n", "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn raw_command_not_found_is_exec_failed(tier: Tier) {
    let r = run_on(tier, ["--", "definitely-not-a-program-xyz"]).json();
    assert_ne!(r.exit_code(), Some(0), "{}", r.describe());
    assert_ne!(r.cli_code(), 0, "{}", r.describe());
    assert_eq!(r.error_code().as_deref(), Some("exec_failed"), "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn file_flag_runs_the_file(tier: Tier) {
    let (_dir, path) = host_file("prog.py", b"import sys\nprint('from file', sys.argv[0])\n");
    let r = run_on(tier, ["--lang", "python", "--file", path.to_str().unwrap()]).json();
    r.assert_exit(0);
    assert!(r.stdout().starts_with("from file /sandbox/"), "code is stored under /sandbox/\n{}", r.describe());
    assert!(!r.stdout().contains(path.to_str().unwrap()), "host path leaked into the sandbox\n{}", r.describe());
    assert_gone(tier, &r.id());
}

fn code_from_stdin_runs_with_empty_program_stdin(tier: Tier) {
    let r =
        run_on(tier, ["--lang", "python"]).stdin("import sys\nprint('stdin code', repr(sys.stdin.read()))\n").json();
    r.assert_exit(0);
    assert_eq!(r.stdout(), "stdin code ''\n", "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn program_stdin_is_forwarded(tier: Tier) {
    let r = code_on(tier, "python", "import sys; print(sys.stdin.read().upper())", &[]).stdin("abc\ndef").json();
    r.assert_exit(0);
    assert_eq!(r.stdout(), "ABC\nDEF\n", "{}", r.describe());
    assert_gone(tier, &r.id());
    let r = run_on(tier, ["--", "cat"]).stdin(&b"raw\x00bytes"[..]).json();
    r.assert_exit(0);
    assert_eq!(r.stdout_bytes(), b"raw\x00bytes", "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn upload_is_visible_inside(tier: Tier) {
    let secret = unique_token("UPLOAD");
    let (_dir, path) = host_file("in.txt", secret.as_bytes());
    let local = path.to_str().unwrap();
    let r = run_on(
        tier,
        [
            "--lang",
            "bash",
            "--code",
            "cat /workspace/data/in.txt; echo; cat /tmp/up.txt; echo; cat rel.txt",
            "--upload",
            &format!("{local}:data/in.txt"),
            "--upload",
            &format!("{local}:/tmp/up.txt"),
            "--upload",
            &format!("{local}:rel.txt"),
        ],
    )
    .json();
    r.assert_exit(0);
    assert_eq!(r.stdout(), format!("{secret}\n{secret}\n{secret}"), "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn env_flag_is_visible_and_nothing_else(tier: Tier) {
    let r = code_on(
        tier,
        "python",
        "import os, json; print(json.dumps(dict(os.environ), sort_keys=True))",
        &["--env", "FOO=bar baz", "--env", "EMPTY="],
    )
    .env("SANDKASTEN_TEST_CANARY", "host-only")
    .json();
    r.assert_exit(0);
    let env: serde_json::Value = serde_json::from_str(r.stdout().trim()).expect("env json");
    assert_eq!(env["FOO"], "bar baz", "{}", r.describe());
    assert_eq!(env["EMPTY"], "", "{}", r.describe());
    assert_eq!(env["HOME"], "/workspace", "{}", r.describe());
    assert_eq!(env["LANG"], "C.UTF-8", "{}", r.describe());
    assert_eq!(env["PATH"], "/usr/local/bin:/usr/bin:/bin:/.sandkasten/run/bin", "{}", r.describe());
    let keys: Vec<&String> = env.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["EMPTY", "FOO", "HOME", "LANG", "PATH"], "only the documented variables\n{}", r.describe());
    assert_gone(tier, &r.id());
}

fn non_utf8_output_is_kept_exactly_in_base64(tier: Tier) {
    let r = code_on(tier, "bash", r"printf '\xff\xfe'; printf 'e\xffrr' >&2", &[]).json();
    r.assert_exit(0);
    let b64 = r.json["stdout_base64"].as_str().unwrap_or_else(|| panic!("no stdout_base64\n{}", r.describe()));
    assert_eq!(base64_decode(b64), [0xff, 0xfe], "{}", r.describe());
    let b64 = r.json["stderr_base64"].as_str().unwrap_or_else(|| panic!("no stderr_base64\n{}", r.describe()));
    assert_eq!(base64_decode(b64), b"e\xffrr", "{}", r.describe());
    assert_gone(tier, &r.id());
    let plain = code_on(tier, "bash", r"printf '\xff\xfe'", &[]).output();
    assert_eq!(plain.stdout, [0xff, 0xfe], "plain mode streams the exact bytes\n{}", plain.describe());
}

fn utf8_output_has_no_base64_field(tier: Tier) {
    let r = code_on(tier, "python", "print('grüß 🦀')", &[]).json();
    r.assert_exit(0);
    assert_eq!(r.stdout(), "grüß 🦀\n", "{}", r.describe());
    assert!(r.json.get("stdout_base64").is_none(), "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn identity_is_sandbox_user_in_workspace(tier: Tier) {
    let r =
        code_on(tier, "bash", "id -u; id -g; whoami; hostname; pwd; echo $HOME; cat /proc/sys/kernel/hostname", &[])
            .json();
    r.assert_exit(0);
    assert_eq!(r.stdout(), "1000\n1000\nsandbox\nsandbox\n/workspace\n/workspace\nsandbox\n", "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn code_file_is_read_only_under_sandbox_dir(tier: Tier) {
    let code = "import sys\nprint(__file__)\ntry:\n    open(__file__, 'a').write('x')\n    print('WRITABLE')\nexcept OSError as e:\n    print('denied', type(e).__name__)\n";
    let r = code_on(tier, "python", code, &[]).json();
    r.assert_exit(0);
    assert!(r.stdout().starts_with("/sandbox/"), "{}", r.describe());
    assert!(r.stdout().contains("denied"), "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn json_result_has_documented_fields(tier: Tier) {
    let r = code_on(tier, "bash", "echo ok", &[]).json();
    for key in [
        "sandbox_id",
        "exit_code",
        "signal",
        "stdout",
        "stderr",
        "stdout_truncated",
        "stderr_truncated",
        "timed_out",
        "oom_killed",
        "limit",
        "duration_ms",
        "phases",
        "usage",
        "error",
    ] {
        assert!(r.json.get(key).is_some(), "missing {key}\n{}", r.describe());
    }
    for key in ["allocate", "filesystem_ready", "runtime_ready", "first_command"] {
        assert!(r.json["phases"][key].is_f64() || r.json["phases"][key].is_u64(), "phases.{key}\n{}", r.describe());
    }
    for key in ["cpu_user_ms", "cpu_system_ms", "memory_peak_bytes"] {
        assert!(r.json["usage"][key].is_number(), "usage.{key}\n{}", r.describe());
    }
    assert!(r.json["duration_ms"].as_f64().unwrap_or(0.0) > 0.0, "{}", r.describe());
    let id = r.id();
    assert!(!id.contains('/') && !id.contains(".."), "sandbox id is path-safe: {id}");
    assert_gone(tier, &id);
}

fn sandbox_ids_are_unique_per_run(tier: Tier) {
    let a = code_on(tier, "bash", "true", &[]).json();
    let b = code_on(tier, "bash", "true", &[]).json();
    assert_ne!(a.id(), b.id());
    assert_gone(tier, &a.id());
    assert_gone(tier, &b.id());
}
