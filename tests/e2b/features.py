"""Which feature of the E2B SDKs each test of this suite proves: the one place that groups the tests into the rows of
docs/e2b-compat.md's compatibility matrix (tests/e2b/compat_matrix.py reads it). Rules are tried in order on a test's
pytest node id without its parameters (`test_files.py::test_gzip_upload`); the first matching pattern names the row,
and rows appear in this order. A test no rule matches makes the matrix fail, so a new test has to be placed here."""

import re

# (row of the matrix, regular expressions matched against "FILE::TEST" with `re.search`)
FEATURES: list[tuple[str, list[str]]] = [
    ("`Sandbox.create`, `connect`, `kill`, `get_info`, `set_timeout`", [
        r"test_lifecycle\.py::test_(create|connect|unknown|kill|context_manager|a_wrong_api_key|get_info|set_timeout)",
        r"test_async\.py::test_create_connect_list_info_timeout_kill",
    ]),
    ("`Sandbox.list` (paging, filters)", [
        r"test_lifecycle\.py::test_(list|bad_list)",
        r"test_async\.py::test_list_pages",
    ]),
    ("`pause`, resume on `connect`, `lifecycle`", [
        r"test_lifecycle\.py::test_(pause|a_filesystem_pause|on_timeout_pause|auto_resume)",
        r"test_async\.py::test_pause",
    ]),
    ("network options, `update_network`", [
        r"test_lifecycle\.py::test_(internet_access|network_rules|update_network|features_sandkasten_lacks)",
        r"test_async\.py::test_update_network",
    ]),
    ("`Secret` (create, get_info, update, list, destroy), secrets in `network.rules`", [r"test_secrets\.py::"]),
    ("the base image: `python`, `pip`, `node`, `git`, `curl`, home; `sudo`", [
        r"test_base_image\.py::test_(base_image|sudo|the_user_s_home)",
        r"test_async\.py::test_sudo",
    ]),
    ("a command killed with its sandbox, `mcp`", [
        r"test_base_image\.py::test_(a_command|an_async_command|mcp)",
    ]),
    ("access tokens and tenants", [r"test_isolation\.py::"]),
    ("`commands.run` (foreground)", [
        r"test_commands\.py::test_(run_returns|nonzero_exit|commands_run_under_bash|default_user|user_root|envs_and_cwd"
        r"|missing_cwd|command_timeout|binary_and_large)",
        r"test_lifecycle\.py::test_exit_code_error",
        r"test_async\.py::test_(command_result|timeout_raises|concurrent_commands)",
    ]),
    ("`on_stdout` / `on_stderr` streaming", [
        r"test_commands\.py::test_stdout_and_stderr_callbacks",
        r"test_async\.py::test_callbacks_stream",
    ]),
    ("background commands, stdin, `list`/`connect`/`kill`", [
        r"test_commands\.py::test_(background|handle_kill|send_stdin|close_stdin|stdin_is_empty|connect_to)",
        r"test_async\.py::test_(background_stdin|close_stdin)",
    ]),
    ("`files.read` / `write` / `write_files` (gzip, streams)", [
        r"test_files\.py::test_(write|read|relative_paths|large_streamed|gzip)",
        r"test_async\.py::test_files$",
    ]),
    ("`files.list` / `exists` / `get_info` / `make_dir` / `rename` / `remove`", [
        r"test_files\.py::test_(list|exists|get_info|make_dir|rename|remov|missing_paths|root_owned)",
        r"test_async\.py::test_files_answer",
    ]),
    ('`files.*(user="root")`', [r"test_files\.py::test_(files_as_root|root_s_file_operations)"]),
    ("`files.write(metadata=…)`", [
        r"test_files\.py::test_file_metadata",
        r"test_async\.py::test_file_metadata_root_files_and_signed_urls",
    ]),
    ("`download_url` / `upload_url` (signed)", [r"test_files\.py::test_signed_download_and_upload_urls"]),
    ("`files.watch_dir`", [
        r"test_files\.py::test_(watch|a_recursive_watch|a_watch|a_sandbox_holds_at_most_16_watches)",
        r"test_async\.py::test_(watch_dir|a_watch|a_streamed_watch)",
    ]),
    ("PTY (`sandbox.pty`)", [r"test_pty\.py::"]),
    ("`get_host(port)`", [r"test_ports\.py::"]),
    ("`get_metrics`", [r"test_metrics\.py::"]),
    ("snapshots (`create_snapshot`, `list_snapshots`, `delete_snapshot`)", [
        r"test_snapshots\.py::test_(list_snapshots|a_full_snapshot|a_filesystem_snapshot|another_tenants_snapshot)",
    ]),
    ("`fork`", [r"test_snapshots\.py::test_fork"]),
    ("`run_code` (Python: state, logs, results, errors)", [
        r"test_code_interpreter\.py::test_(python_state|execution_count|logs_collect|stdout_reaches|result_and_error"
        r"|error_has|matplotlib_plot|pandas|code_interpreter_sandbox_also|create_envs_reach)",
        r"test_async\.py::test_code_interpreter_async",
    ]),
    ("`run_code(envs=…)`, context `cwd`", [
        r"test_code_interpreter\.py::test_(envs|created_context_uses_its_cwd|a_context_in_a_missing)",
        r"test_async\.py::test_code_interpreter_envs_and_cwd",
    ]),
    ("`run_code` timeouts, interrupts, restarts, kills", [
        r"test_code_interpreter\.py::test_(execution_timeout|a_cell_whose|a_timed_out|an_interpreter|killing_the_sandbox)",
        r"test_async\.py::test_code_interpreter_recovers",
    ]),
    ("code contexts (`create`/`list`/`restart`/`remove`)", [r"test_code_interpreter\.py::test_created_context_is"]),
    ("`run_code` JavaScript, bash, other languages", [
        r"test_code_interpreter\.py::test_(javascript|languages|language_and_context|bash|typescript|java|r_)",
        r"test_async\.py::test_code_interpreter_languages",
    ]),
    ("`display(...)`", [
        r"test_code_interpreter\.py::test_(display|displayed)",
        r"test_async\.py::test_code_interpreter_display",
    ]),
    ("`result.chart`", [
        r"test_code_interpreter\.py::test_matplotlib_charts",
        r"test_async\.py::test_code_interpreter_chart",
    ]),
]

_COMPILED = [(feature, [re.compile(pattern) for pattern in patterns]) for feature, patterns in FEATURES]


def feature_of(test: str) -> str | None:
    """The row of `test` (a pytest node id, parameters allowed), or None when no rule names it."""
    bare = test.split("[", 1)[0]
    for feature, patterns in _COMPILED:
        if any(pattern.search(bare) for pattern in patterns):
            return feature
    return None


def rows() -> list[str]:
    return [feature for feature, _ in FEATURES]
