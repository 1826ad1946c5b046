//! Templates (issue #16) on every tier: a template with a pip and an npm package built from the real registries
//! (through the egress proxy, the steps reporting their downloads) runs with both importable while the host stays
//! without them (on gVisor from the overlay runsc's mount namespace mounts, in a microVM from the image of its
//! layers); an unchanged rebuild takes every layer from the cache and a changed last step rebuilds only that one (the build's JSON lines
//! say so); bad specs, failing steps and a failing `ready` exit 2 naming the field or the step with its output and
//! leave no template; a build step cannot reach a host that is not an allowed registry (the test host sees nothing);
//! a build killed with SIGKILL leaves nothing a later build takes for finished; a template changes and deletes what
//! its base's layers hold (pip into the base's venv) without changing them. Templates are pushed to and pulled
//! from the template store, and `template prune` deletes old versions there with the chunks only they referenced.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
#[allow(dead_code)]
#[path = "egress/testnet.rs"]
mod testnet;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Cli, Output};
use serde_json::Value;

/// A template cache of the test's own (not under /tmp: sandboxes assemble their root there).
fn cache_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("sk-templates-test-").tempdir_in("/var/tmp").expect("cache dir")
}

/// `sandkasten run --template NAME -- COMMAND` on gVisor (the layers' overlay is mounted in runsc's own mount
/// namespace and bound at `/opt`), or `None` with the reason printed when the tier cannot run here.
fn on_gvisor(cache: &str, name: &str, command: &[&str]) -> Option<Output> {
    if let Some(why) = common::gvisor_unavailable() {
        eprintln!("skipped the gvisor part: {why}");
        return None;
    }
    let mut args = vec!["--isolation", "gvisor", "--template-cache", cache, "--template", name, "--"];
    args.extend(command);
    Some(common::run(args).output())
}

/// `sandkasten run --template NAME -- COMMAND` in a microVM (the guest's `/opt` is an image of the template's
/// layers), or `None` with the reason printed when the tier cannot run here.
fn on_microvm(cache: &str, name: &str, command: &[&str]) -> Option<Output> {
    if let Some(why) = common::microvm::microvm_unavailable() {
        eprintln!("skipped the microvm part: {why}");
        return None;
    }
    // Python and node each take seconds to start under TCG, more on a loaded machine: the default 10 s limit is not
    // what these runs are about.
    let mut args =
        vec!["--isolation", "microvm", "--timeout", "90s", "--template-cache", cache, "--template", name, "--"];
    args.extend(command);
    Some(common::run(args).watchdog(common::microvm::VM_WATCHDOG).output())
}

fn template(cache: &Path, args: &[&str]) -> Cli {
    let mut all = vec!["template".to_owned(), "--cache".to_owned(), cache.display().to_string()];
    all.extend(args.iter().map(|s| (*s).to_owned()));
    Cli::new(all).watchdog(Duration::from_secs(300))
}

/// Writes `spec` as `template.toml` in a new directory.
fn spec_file(spec: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("spec dir");
    let path = dir.path().join("template.toml");
    std::fs::write(&path, spec).expect("write spec");
    (dir, path)
}

/// The build's JSON lines.
fn events(output: &Output) -> Vec<Value> {
    output.stdout_text().lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

/// `(title, cached)` of every `step` event.
fn steps(output: &Output) -> Vec<(String, bool)> {
    events(output)
        .iter()
        .filter(|e| e["event"] == "step")
        .map(|e| (e["title"].as_str().unwrap_or_default().to_owned(), e["cached"] == true))
        .collect()
}

fn template_names(cache: &Path) -> Vec<String> {
    let output = template(cache, &["list", "--json"]).output();
    assert_eq!(output.code, 0, "{}", output.describe());
    let listed: Vec<Value> = serde_json::from_str(&output.stdout_text()).expect("list json");
    listed.iter().map(|t| t["name"].as_str().unwrap_or_default().to_owned()).collect()
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .flat_map(|entry| if entry.path().is_dir() { files_under(&entry.path()) } else { vec![entry.path()] })
        .collect()
}

fn partials(cache: &Path) -> Vec<String> {
    ["layers", "keys", "templates"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(cache.join(dir)).into_iter().flatten().flatten())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".partial-"))
        .collect()
}

fn mounts_under(path: &Path) -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = path.display().to_string();
    mounts.lines().filter(|line| line.contains(&prefix)).map(str::to_owned).collect()
}

const TABLES: &str = r#"
name = "tables"
base = "host"
run = ["echo one > /opt/marker.txt"]
ready = "python3 -c 'import tabulate' && node -e 'require(\"left-pad\")'"
[packages]
pip = ["tabulate==0.10.0"]
npm = ["left-pad@1.3.0"]
"#;

#[test]
fn a_template_with_pip_and_npm_packages_runs_and_rebuilds_from_its_cache() {
    require_root!();
    let cache = cache_dir();
    let host_opt_before: Vec<_> =
        std::fs::read_dir("/opt").into_iter().flatten().flatten().map(|e| e.file_name()).collect();
    let (_dir, spec) = spec_file(TABLES);
    let spec = spec.display().to_string();
    let build = |spec: &str| template(cache.path(), &["build", "--json", "--allow-registry-addresses", spec]).output();
    let first = build(&spec);
    assert_eq!(first.code, 0, "{}", first.describe());
    assert_eq!(
        steps(&first),
        vec![
            ("pip tabulate==0.10.0".to_owned(), false),
            ("npm left-pad@1.3.0".to_owned(), false),
            ("run echo one > /opt/marker.txt".to_owned(), false)
        ]
    );
    // The pip and npm steps report what they downloaded through the egress proxy, growing; the `run` step nothing.
    let downloads = |index: u64| -> Vec<u64> {
        events(&first)
            .iter()
            .filter(|event| event["event"] == "download" && event["index"] == index)
            .map(|event| event["bytes"].as_u64().unwrap())
            .collect()
    };
    for index in [0, 1] {
        let seen = downloads(index);
        assert!(seen.last().is_some_and(|last| *last > 1000), "step {index} downloaded {seen:?}");
        assert!(seen.windows(2).all(|pair| pair[0] < pair[1]), "step {index}: {seen:?}");
    }
    assert_eq!(downloads(2), Vec::<u64>::new());

    let script = "python3 -c 'import tabulate; print(tabulate.tabulate([[\"ok\", 1]]))' && \
                  node -e 'console.log(require(\"left-pad\")(\"pad\", 6, \"*\"))' && cat /opt/marker.txt";
    let cache_arg = cache.path().display().to_string();
    let run =
        common::run(["--template-cache", &cache_arg, "--template", "tables", "--", "bash", "-c", script]).output();
    assert_eq!(run.code, 0, "{}", run.describe());
    let printed = run.stdout_text();
    assert!(printed.contains("ok") && printed.contains("***pad") && printed.contains("one"), "{printed}");

    // The packages live in the layers only: the host's Python has no tabulate, the host's /opt is as it was.
    let host =
        std::process::Command::new("/usr/bin/python3").args(["-c", "import tabulate"]).output().expect("python3");
    assert!(!host.status.success(), "the host's python3 imports tabulate: the test proves nothing here");
    let host_opt_after: Vec<_> =
        std::fs::read_dir("/opt").into_iter().flatten().flatten().map(|e| e.file_name()).collect();
    assert_eq!(host_opt_before, host_opt_after, "the build changed the host's /opt");
    // The template's /opt is read-only.
    let write = common::run(["--template-cache", &cache_arg, "--template", "tables", "--", "touch", "/opt/x"]).output();
    assert_ne!(write.code, 0, "{}", write.describe());
    // On gVisor: the same packages from the overlay, read-only for the sandbox's root too (the overlay is mounted
    // read-only in runsc's namespace), and nothing of it mounted on the host.
    if let Some(gv) = on_gvisor(&cache_arg, "tables", &["bash", "-c", script]) {
        assert_eq!(gv.code, 0, "{}", gv.describe());
        let printed = gv.stdout_text();
        assert!(printed.contains("ok") && printed.contains("***pad") && printed.contains("one"), "{printed}");
        let write = on_gvisor(&cache_arg, "tables", &["sudo", "touch", "/opt/x"]).expect("the tier ran just now");
        assert_ne!(write.code, 0, "{}", write.describe());
        let host_mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        assert!(!host_mounts.contains("sandkasten/gvisor"), "a gVisor bundle's mount is on the host:\n{host_mounts}");
    }
    // In a microVM: the same packages from the image of the layers, read-only too (even for the sandbox's root).
    if let Some(vm) = on_microvm(&cache_arg, "tables", &["bash", "-c", script]) {
        assert_eq!(vm.code, 0, "{}", vm.describe());
        let printed = vm.stdout_text();
        assert!(printed.contains("ok") && printed.contains("***pad") && printed.contains("one"), "{printed}");
        let write = on_microvm(&cache_arg, "tables", &["sudo", "touch", "/opt/x"]).expect("the tier ran just now");
        assert_ne!(write.code, 0, "{}", write.describe());
    }

    let again = build(&spec);
    assert_eq!(again.code, 0, "{}", again.describe());
    assert!(steps(&again).iter().all(|(_, cached)| *cached), "an unchanged rebuild: {:?}", steps(&again));

    let (_changed_dir, changed) = spec_file(&TABLES.replace("echo one", "echo two"));
    let third = build(&changed.display().to_string());
    assert_eq!(third.code, 0, "{}", third.describe());
    let cached: Vec<bool> = steps(&third).into_iter().map(|(_, cached)| cached).collect();
    assert_eq!(cached, vec![true, true, false], "only the changed last step is rebuilt");
    let marker =
        common::run(["--template-cache", &cache_arg, "--template", "tables", "--", "cat", "/opt/marker.txt"]).output();
    assert_eq!(marker.stdout_text().trim(), "two", "{}", marker.describe());

    let removed = template(cache.path(), &["rm", "tables"]).output();
    assert_eq!(removed.code, 0, "{}", removed.describe());
    assert!(template_names(cache.path()).is_empty());
    let layers = std::fs::read_dir(cache.path().join("layers")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(layers, 0, "removing the only template collects every layer");
    assert!(mounts_under(cache.path()).is_empty(), "{:?}", mounts_under(cache.path()));
}

#[test]
fn bad_specs_exit_2_naming_the_field() {
    let cache = cache_dir();
    for (spec, needle) in [
        ("name = \"a\"\nbase = \"host\"\nrn = [\"x\"]\n", "unknown field `rn`"),
        ("name = \"a\"\nbase = \"host\"\nrun = \"echo\"\n", "run: line 3"),
        ("name = \"a\"\n", "missing field `base`"),
        ("name = \"a\"\nbase = \"host\"\n[[files]]\nsrc = \"x\"\ndest = \"/usr/x\"\n", "files[0].dest"),
    ] {
        let (_dir, path) = spec_file(spec);
        let path = path.display().to_string();
        for command in [vec!["check", &path], vec!["build", &path]] {
            let output = template(cache.path(), &command).output();
            assert_eq!(output.code, 2, "{spec}: {}", output.describe());
            assert!(output.stderr_text().contains(needle), "{spec}: {needle}: {}", output.describe());
        }
    }
    let dir = tempfile::tempdir().expect("dir");
    let dockerfile = dir.path().join("Dockerfile");
    std::fs::write(&dockerfile, "FROM host\nEXPOSE 80\n").expect("write");
    let output = template(cache.path(), &["check", &dockerfile.display().to_string()]).output();
    assert_eq!(output.code, 2, "{}", output.describe());
    assert!(output.stderr_text().contains("line 2: EXPOSE is not supported"), "{}", output.describe());
    let debian = spec_file("name = \"d\"\nbase = \"debian:bookworm\"\n");
    let output = template(cache.path(), &["build", &debian.1.display().to_string()]).output();
    assert_eq!(output.code, 2, "{}", output.describe());
    assert!(output.stderr_text().contains("cannot be built yet"), "{}", output.describe());
    assert!(template_names(cache.path()).is_empty());
}

#[test]
fn a_failing_step_or_ready_exits_2_with_its_output_and_leaves_no_template() {
    let cache = cache_dir();
    let (_a, failing_step) =
        spec_file("name = \"broken\"\nbase = \"host\"\nrun = [\"echo ok\", \"echo visible-step-output; exit 3\"]\n");
    let output = template(cache.path(), &["build", &failing_step.display().to_string()]).output();
    assert_eq!(output.code, 2, "{}", output.describe());
    let stderr = output.stderr_text();
    assert!(stderr.contains("step 2 (run echo visible-step-output; exit 3) exited with 3"), "{stderr}");
    assert!(stderr.contains("visible-step-output"), "{stderr}");

    let (_b, failing_ready) = spec_file(
        "name = \"unready\"\nbase = \"host\"\nrun = [\"echo ok\"]\nready = \"echo not-ready-output; false\"\n",
    );
    let output = template(cache.path(), &["build", "--json", &failing_ready.display().to_string()]).output();
    assert_eq!(output.code, 2, "{}", output.describe());
    let failed = events(&output).into_iter().find(|e| e["event"] == "failed").expect("a failed line");
    assert_eq!(failed["step"], "ready", "{failed}");
    assert!(failed["output"].as_str().unwrap_or_default().contains("not-ready-output"), "{failed}");
    assert!(template_names(cache.path()).is_empty(), "no template after failed builds");
    assert!(partials(cache.path()).is_empty(), "{:?}", partials(cache.path()));
}

#[test]
fn a_build_step_cannot_reach_a_host_that_is_not_an_allowed_registry() {
    require_root!();
    let cache = cache_dir();
    let host = testnet::TestHost::start("forbidden.test", "10.203.7.1", "10.203.7.2", 80);
    std::fs::write(host.dir().join("secret.txt"), "should-not-arrive").expect("write");
    let reach = "curl -s --max-time 5 http://10.203.7.2/secret.txt; curl -s --noproxy '*' --max-time 5 \
                 http://10.203.7.2/secret.txt; exit 1";
    let spec = format!("name = \"reach\"\nbase = \"host\"\nrun = [\"{reach}\"]\n");
    let (_dir, path) = spec_file(&spec);
    let path = path.display().to_string();
    // The test host's range is allowed as an address: only the registry allowlist stands between the step and it.
    let refused = template(
        cache.path(),
        &["build", "--registry", "registry.example.invalid:443", "--allow-cidr", "10.203.7.0/30", &path],
    )
    .output();
    assert_eq!(refused.code, 2, "{}", refused.describe());
    assert!(refused.stderr_text().contains("the egress proxy refused 10.203.7.2:80"), "{}", refused.describe());
    assert!(!refused.stderr_text().contains("should-not-arrive"), "{}", refused.describe());
    assert_eq!(host.requests(), "", "the test host saw a request from a build step");

    // The control: allowed as a registry (by the config file's `[templates]`, its address by `[egress]`), the same
    // step reaches it, so the refusal above is the allowlist's.
    let allowed_spec =
        "name = \"reach\"\nbase = \"host\"\nrun = [\"curl -sf --max-time 5 http://10.203.7.2/secret.txt\"]\n";
    let (allowed_dir, allowed) = spec_file(allowed_spec);
    let config = allowed_dir.path().join("sandkasten.toml");
    std::fs::write(
        &config,
        "[templates]\nregistries = [\"10.203.7.2:80\"]\n[egress]\nallow_cidrs = [\"10.203.7.0/30\"]\n",
    )
    .expect("write config");
    let config = config.display().to_string();
    let allowed = template(cache.path(), &["build", "--config", &config, &allowed.display().to_string()]).output();
    assert_eq!(allowed.code, 0, "{}", allowed.describe());
    assert!(allowed.stderr_text().contains("should-not-arrive"), "{}", allowed.describe());
    assert!(host.requests().contains("GET"), "{}", host.requests());
}

#[test]
fn a_killed_build_leaves_nothing_a_later_build_takes_for_finished() {
    require_root!();
    let cache = cache_dir();
    let marker = common::unique_token("started-");
    let spec = |second: &str| {
        format!("name = \"killed\"\nbase = \"host\"\nrun = [\"echo first > /opt/first\", \"{second}\"]\n")
    };
    let (_dir, path) = spec_file(&spec(&format!("echo {marker}; echo partial > /opt/partial; sleep 60")));
    let mut child = std::process::Command::new(common::bin())
        .args(["template", "--cache", &cache.path().display().to_string(), "build", "--json"])
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the build");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        assert!(std::time::Instant::now() < deadline, "the second step never started");
        match lines.next() {
            Some(Ok(line)) if line.contains(&marker) => break,
            Some(Ok(_)) => {}
            _ => panic!("the build ended before its second step printed"),
        }
    }
    child.kill().expect("SIGKILL the build");
    let _ = child.wait();
    assert!(template_names(cache.path()).is_empty(), "a killed build made a template");

    let (_again_dir, again) = spec_file(&spec("test ! -e /opt/partial && echo clean > /opt/second"));
    let rebuilt = template(cache.path(), &["build", "--json", &again.display().to_string()]).output();
    assert_eq!(rebuilt.code, 0, "the killed step's writes reached the rebuild: {}", rebuilt.describe());
    let cached: Vec<bool> = steps(&rebuilt).into_iter().map(|(_, cached)| cached).collect();
    assert_eq!(cached, vec![true, false], "the finished first step is reused, the killed one is not");
    assert!(partials(cache.path()).is_empty(), "{:?}", partials(cache.path()));
    assert!(
        mounts_under(cache.path()).is_empty(),
        "the killed build's tmpfs is gone: {:?}",
        mounts_under(cache.path())
    );
    let build_dir = std::fs::read_dir(cache.path().join("build")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(build_dir, 0);
}

#[test]
fn a_file_a_later_step_deletes_is_gone_from_the_template() {
    require_root!();
    let cache = cache_dir();
    let (_dir, path) =
        spec_file("name = \"deleted\"\nbase = \"host\"\nrun = [\"echo a > /opt/a; echo b > /opt/b\", \"rm /opt/a\"]\n");
    let built = template(cache.path(), &["build", &path.display().to_string()]).output();
    assert_eq!(built.code, 0, "{}", built.describe());
    let cache_arg = cache.path().display().to_string();
    let listing =
        common::run(["--template-cache", &cache_arg, "--template", "deleted", "--", "ls", "-A", "/opt"]).output();
    assert_eq!(listing.code, 0, "{}", listing.describe());
    assert_eq!(listing.stdout_text().split_whitespace().collect::<Vec<_>>(), vec!["b"], "{}", listing.describe());
    if let Some(gv) = on_gvisor(&cache_arg, "deleted", &["ls", "-A", "/opt"]) {
        assert_eq!(gv.code, 0, "{}", gv.describe());
        assert_eq!(gv.stdout_text().split_whitespace().collect::<Vec<_>>(), vec!["b"], "{}", gv.describe());
    }
    if let Some(vm) = on_microvm(&cache_arg, "deleted", &["ls", "-A", "/opt"]) {
        assert_eq!(vm.code, 0, "{}", vm.describe());
        assert_eq!(vm.stdout_text().split_whitespace().collect::<Vec<_>>(), vec!["b"], "{}", vm.describe());
    }
}

/// A template removed while one of its sandboxes runs keeps its layers until that sandbox ended: the sandbox still
/// reads the template's file after `template rm`, and `template gc` afterwards removes the layer.
#[test]
fn a_template_removed_while_its_sandbox_runs_keeps_its_layers_until_gc() {
    require_root!();
    let cache = common::build_template("name = \"held\"\nbase = \"host\"\nrun = [\"echo held > /opt/held\"]\n");
    let cache_arg = cache.path().display().to_string();
    let layers = || std::fs::read_dir(cache.path().join("layers")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(layers(), 1);
    let sandbox = std::process::Command::new(common::bin())
        .args(["run", "--template-cache", &cache_arg, "--template", "held", "--timeout", "60s", "--"])
        .args(["bash", "-c", "sleep 5; cat /opt/held"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("sandkasten run");
    // The sandbox's runtime record names the layer once it is being set up.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let recorded = || {
        std::fs::read_dir("/run/sandkasten/sandboxes").into_iter().flatten().flatten().any(|entry| {
            std::fs::read_to_string(entry.path()).is_ok_and(|text| text.contains(cache.path().to_str().unwrap()))
        })
    };
    while !recorded() {
        assert!(std::time::Instant::now() < deadline, "no sandbox record names the template's layer");
        std::thread::sleep(Duration::from_millis(20));
    }
    let removed = template(cache.path(), &["rm", "held"]).output();
    assert_eq!(removed.code, 0, "{}", removed.describe());
    assert!(removed.stdout_text().contains("1 kept while sandboxes read them"), "{}", removed.describe());
    assert_eq!(layers(), 1, "the running sandbox's layer was removed");
    let finished = sandbox.wait_with_output().expect("the sandbox's run");
    assert!(finished.status.success(), "{}", String::from_utf8_lossy(&finished.stderr));
    assert_eq!(String::from_utf8_lossy(&finished.stdout), "held\n");
    let collected = template(cache.path(), &["gc"]).output();
    assert_eq!(collected.code, 0, "{}", collected.describe());
    assert!(collected.stdout_text().contains("1 unused layers removed"), "{}", collected.describe());
    assert_eq!(layers(), 0, "gc left the layer of a removed template whose sandbox ended");
}

/// A template extends another built one: the base's layers lie below (its files are there, the new step reads
/// them), its env is inherited and overridden key by key, a rebuild with no change is cached, and a rebuilt base
/// (another layer) rebuilds what extends it; an unbuilt base exits 2 naming `base`.
#[test]
fn a_template_extends_another_built_one() {
    require_root!();
    let cache = cache_dir();
    let base_spec = |line: &str| {
        format!(
            "name = \"lower\"\nbase = \"host\"\nrun = [\"echo {line} > /opt/lower.txt\"]\n[env]\nMODE = \"lower\"\n\
             KEPT = \"from-lower\"\n"
        )
    };
    let (lower_dir, lower) = spec_file(&base_spec("first-base"));
    let lower = lower.display().to_string();
    let built = template(cache.path(), &["build", "--json", &lower]).output();
    assert_eq!(built.code, 0, "{}", built.describe());
    let (_upper_dir, upper) = spec_file(
        "name = \"upper\"\nbase = \"lower\"\nrun = [\"cat /opt/lower.txt > /opt/upper.txt; echo upper >> \
         /opt/upper.txt\"]\nready = \"test \\\"$KEPT\\\" = from-lower\"\n[env]\nMODE = \"upper\"\n",
    );
    let upper = upper.display().to_string();
    let build_upper = || template(cache.path(), &["build", "--json", &upper]).output();
    let first = build_upper();
    assert_eq!(first.code, 0, "{}", first.describe());
    assert_eq!(
        steps(&first),
        vec![("run cat /opt/lower.txt > /opt/upper.txt; echo upper >> /opt/upper.txt".to_owned(), false)]
    );
    let cache_arg = cache.path().display().to_string();
    let script = "cat /opt/upper.txt /opt/lower.txt; echo \"$MODE $KEPT\"";
    let run =
        || common::run(["--template-cache", &cache_arg, "--template", "upper", "--", "bash", "-c", script]).output();
    let output = run();
    assert_eq!(output.code, 0, "{}", output.describe());
    assert_eq!(output.stdout_text(), "first-base\nupper\nfirst-base\nupper from-lower\n", "{}", output.describe());
    let listed = template(cache.path(), &["list", "--json"]).output();
    let listed: Vec<Value> = serde_json::from_str(&listed.stdout_text()).expect("list json");
    let upper_record = listed.iter().find(|t| t["name"] == "upper").expect("upper listed");
    assert_eq!(upper_record["base"], "lower");
    assert_eq!(upper_record["layers"].as_array().map(Vec::len), Some(2), "{upper_record}");

    let again = build_upper();
    assert_eq!(again.code, 0, "{}", again.describe());
    assert!(steps(&again).iter().all(|(_, cached)| *cached), "{}", again.describe());

    std::fs::write(lower_dir.path().join("template.toml"), base_spec("second-base")).expect("rewrite lower");
    let rebuilt = template(cache.path(), &["build", &lower]).output();
    assert_eq!(rebuilt.code, 0, "{}", rebuilt.describe());
    let after = build_upper();
    assert_eq!(after.code, 0, "{}", after.describe());
    assert!(steps(&after).iter().all(|(_, cached)| !*cached), "a rebuilt base left upper cached: {}", after.describe());
    let output = run();
    assert_eq!(output.stdout_text(), "second-base\nupper\nsecond-base\nupper from-lower\n", "{}", output.describe());

    let (_missing_dir, missing) = spec_file("name = \"orphan\"\nbase = \"never-built\"\n");
    let orphan = template(cache.path(), &["build", &missing.display().to_string()]).output();
    assert_eq!(orphan.code, 2, "{}", orphan.describe());
    assert!(orphan.stderr_text().contains("base: no template named \"never-built\" is built"), "{}", orphan.describe());
    assert!(!template_names(cache.path()).contains(&"orphan".to_owned()));
}

/// Every entry under `dir` (not following symlinks) with its owner, mode and contents (a symlink's target).
fn tree_state(dir: &Path) -> std::collections::BTreeMap<PathBuf, (u32, u32, u32, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt;
    let mut state = std::collections::BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        let contents = if meta.file_type().is_symlink() {
            std::fs::read_link(&path).expect("readlink").into_os_string().into_encoded_bytes()
        } else if meta.is_file() {
            std::fs::read(&path).expect("read")
        } else {
            Vec::new()
        };
        if meta.is_dir() {
            pending.extend(std::fs::read_dir(&path).expect("readdir").map(|entry| entry.expect("entry").path()));
        }
        state.insert(path, (meta.uid(), meta.gid(), meta.mode(), contents));
    }
    state
}

/// A later build step changes what an earlier layer holds (a build sandbox's lower layers are idmapped to its
/// user): a template installs a pip package into the venv its base made, appends to a file of the base and deletes
/// another. Its sandboxes on every tier see both packages and the changes; the base's sandboxes see the base as it
/// was, and the base's layers on the host (contents, owners, modes) are untouched; nothing stays mounted.
#[test]
fn a_template_changes_and_deletes_what_its_bases_layers_hold() {
    require_root!();
    let cache = cache_dir();
    let build = |spec: &Path| {
        template(cache.path(), &["build", "--json", "--allow-registry-addresses", &spec.display().to_string()]).output()
    };
    let (_base_dir, base) = spec_file(
        "name = \"venv-base\"\nbase = \"host\"\nrun = [\"echo base > /opt/kept.txt; echo doomed > /opt/doomed.txt\"]\n\
         [packages]\npip = [\"tabulate==0.10.0\"]\n",
    );
    let built = build(&base);
    assert_eq!(built.code, 0, "{}", built.describe());
    let base_layers = tree_state(&cache.path().join("layers"));

    let (_child_dir, child) = spec_file(
        "name = \"venv-child\"\nbase = \"venv-base\"\nrun = [\"echo child >> /opt/kept.txt; rm /opt/doomed.txt\"]\n\
         ready = \"python3 -c 'import tabulate, six'\"\n[packages]\npip = [\"six==1.16.0\"]\n",
    );
    let built = build(&child);
    assert_eq!(built.code, 0, "{}", built.describe());
    assert_eq!(
        steps(&built),
        vec![
            ("pip six==1.16.0".to_owned(), false),
            ("run echo child >> /opt/kept.txt; rm /opt/doomed.txt".to_owned(), false)
        ]
    );
    let after = tree_state(&cache.path().join("layers"));
    let changed: Vec<&PathBuf> =
        base_layers.iter().filter(|(path, state)| after.get(*path) != Some(state)).map(|(path, _)| path).collect();
    assert!(changed.is_empty(), "the child's build changed the base's layers on the host: {changed:?}");

    let cache_arg = cache.path().display().to_string();
    let script = "python3 -c 'import tabulate, six; print(six.__version__)'; cat /opt/kept.txt; \
                  test ! -e /opt/doomed.txt && echo doomed-gone";
    let expected = "1.16.0\nbase\nchild\ndoomed-gone\n";
    let base_script = "cat /opt/kept.txt /opt/doomed.txt; python3 -c 'import six' 2>/dev/null || echo no-six";
    let base_expected = "base\ndoomed\nno-six\n";
    for (name, script, expected) in [("venv-child", script, expected), ("venv-base", base_script, base_expected)] {
        let output =
            common::run(["--template-cache", &cache_arg, "--template", name, "--", "bash", "-c", script]).output();
        assert_eq!(output.stdout_text(), expected, "{name} on the process tier: {}", output.describe());
        if let Some(gv) = on_gvisor(&cache_arg, name, &["bash", "-c", script]) {
            assert_eq!(gv.stdout_text(), expected, "{name} on gVisor: {}", gv.describe());
        }
        if let Some(vm) = on_microvm(&cache_arg, name, &["bash", "-c", script]) {
            assert_eq!(vm.stdout_text(), expected, "{name} in a microVM: {}", vm.describe());
        }
    }
    assert!(mounts_under(cache.path()).is_empty(), "{:?}", mounts_under(cache.path()));
}

/// `template push` copies a built template into the template store beside the snapshot store of `--config`, and
/// `template pull` into another cache copies it back: a sandbox of the second cache runs it (the layers came from
/// the store, not the first cache, which is gone by then); a name the store lacks exits 2.
#[test]
fn a_template_is_pushed_to_the_store_and_pulled_into_another_cache() {
    require_root!();
    let first = cache_dir();
    let second = cache_dir();
    let store = tempfile::Builder::new().prefix("sk-template-store-").tempdir_in("/var/tmp").expect("store");
    let (spec_dir, spec) = spec_file(
        "name = \"shared\"\nbase = \"host\"\nrun = [\"echo from-the-store > /opt/shared.txt\", \"mkdir -p /opt/d && echo two > /opt/d/two\"]\n\
         [env]\nSHARED = \"yes\"\n",
    );
    let built = template(first.path(), &["build", &spec.display().to_string()]).output();
    assert_eq!(built.code, 0, "{}", built.describe());
    let config = spec_dir.path().join("sandkasten.toml");
    std::fs::write(&config, format!("[snapshots]\nstore = \"file://{}\"\n", store.path().display())).expect("config");
    let config = config.display().to_string();
    let pushed = template(first.path(), &["push", "shared", "--config", &config]).output();
    assert_eq!(pushed.code, 0, "{}", pushed.describe());
    assert!(pushed.stdout_text().starts_with("pushed shared sha256:"), "{}", pushed.describe());
    assert!(store.path().join("templates").join("manifests").is_dir(), "nothing in the template store");
    let again = template(first.path(), &["push", "shared", "--config", &config]).output();
    assert_eq!(again.code, 0, "an unchanged template is pushed again as a no-op: {}", again.describe());
    drop(first);

    let pulled = template(second.path(), &["pull", "shared", "--config", &config]).output();
    assert_eq!(pulled.code, 0, "{}", pulled.describe());
    let cache_arg = second.path().display().to_string();
    let run = common::run([
        "--template-cache",
        &cache_arg,
        "--template",
        "shared",
        "--",
        "bash",
        "-c",
        "cat /opt/shared.txt /opt/d/two; echo $SHARED",
    ])
    .output();
    assert_eq!(run.code, 0, "{}", run.describe());
    assert_eq!(run.stdout_text(), "from-the-store\ntwo\nyes\n", "{}", run.describe());
    assert!(partials(second.path()).is_empty(), "{:?}", partials(second.path()));

    let missing = template(second.path(), &["pull", "never-pushed", "--config", &config]).output();
    assert_eq!(missing.code, 2, "{}", missing.describe());
    assert!(
        missing.stderr_text().contains("no template named \"never-pushed\" is in the template store"),
        "{}",
        missing.describe()
    );
    let unknown = template(second.path(), &["push", "never-built", "--config", &config]).output();
    assert_eq!(unknown.code, 2, "{}", unknown.describe());
}

/// `template prune` keeps the newest `--keep` versions of each template in the store and deletes the rest, then the
/// chunks only they referenced (`gc_grace_s = 0`); a pull then takes the newest. `--keep 0` needs names and deletes
/// those templates from the store, leaving the others.
#[test]
fn old_versions_are_pruned_from_the_store_with_their_chunks() {
    require_root!();
    let cache = cache_dir();
    let store = tempfile::Builder::new().prefix("sk-template-store-").tempdir_in("/var/tmp").expect("store");
    let spec_dir = tempfile::Builder::new().prefix("sk-prune-spec-").tempdir_in("/var/tmp").expect("spec dir");
    let config = spec_dir.path().join("sandkasten.toml");
    std::fs::write(&config, format!("[snapshots]\nstore = \"file://{}\"\ngc_grace_s = 0\n", store.path().display()))
        .expect("config");
    let config = config.display().to_string();
    let build_and_push = |name: &str, version: u32| {
        let spec = spec_dir.path().join(format!("{name}.toml"));
        let run = format!("echo {name}-{version} > /opt/v");
        std::fs::write(&spec, format!("name = \"{name}\"\nbase = \"host\"\nrun = [\"{run}\"]\n")).expect("spec");
        let built = template(cache.path(), &["build", &spec.display().to_string()]).output();
        assert_eq!(built.code, 0, "{}", built.describe());
        let pushed = template(cache.path(), &["push", name, "--config", &config]).output();
        assert_eq!(pushed.code, 0, "{}", pushed.describe());
    };
    for version in 1..=3 {
        build_and_push("pruned", version);
        // Versions are ordered by their records' `created`, in seconds.
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    build_and_push("other", 1);
    let manifests = || std::fs::read_dir(store.path().join("templates/manifests")).map_or(0, |dir| dir.count());
    let chunks = || files_under(&store.path().join("templates/chunks")).len();
    assert_eq!(manifests(), 4);
    let chunks_before = chunks();

    let pruned = template(cache.path(), &["prune", "--keep", "1", "--config", &config, "--json"]).output();
    assert_eq!(pruned.code, 0, "{}", pruned.describe());
    let report: serde_json::Value = serde_json::from_str(pruned.stdout_text().trim()).expect("prune --json");
    let deleted = report["deleted"].as_array().expect("deleted");
    assert_eq!(deleted.len(), 2, "{report}");
    assert!(deleted.iter().all(|version| version["name"] == "pruned"), "{report}");
    assert_eq!(report["kept"], 2, "{report}");
    assert_eq!(manifests(), 2);
    let freed = report["chunks_deleted"].as_u64().expect("chunks_deleted");
    assert!(freed >= 2, "the two old versions' layers were theirs alone: {report}");
    assert_eq!(chunks(), chunks_before - freed as usize, "{report}");

    let fresh = cache_dir();
    let pulled = template(fresh.path(), &["pull", "pruned", "--config", &config]).output();
    assert_eq!(pulled.code, 0, "{}", pulled.describe());
    let cache_arg = fresh.path().display().to_string();
    let run = common::run(["--template-cache", &cache_arg, "--template", "pruned", "--", "cat", "/opt/v"]).output();
    assert_eq!(run.stdout_text(), "pruned-3\n", "the newest version stays: {}", run.describe());

    let everything = template(cache.path(), &["prune", "--keep", "0", "--config", &config]).output();
    assert_eq!(everything.code, 2, "{}", everything.describe());
    assert!(everything.stderr_text().contains("name the templates"), "{}", everything.describe());
    assert_eq!(manifests(), 2, "a refused prune deletes nothing");
    let named = template(cache.path(), &["prune", "--keep", "0", "pruned", "--config", &config]).output();
    assert_eq!(named.code, 0, "{}", named.describe());
    assert!(named.stdout_text().contains("1 versions deleted, 0 kept"), "{}", named.describe());
    let gone = template(cache_dir().path(), &["pull", "pruned", "--config", &config]).output();
    assert_eq!(gone.code, 2, "{}", gone.describe());
    let other = template(cache_dir().path(), &["pull", "other", "--config", &config]).output();
    assert_eq!(other.code, 0, "the other template stays: {}", other.describe());
}
