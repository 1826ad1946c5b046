//! The built-in templates (`templates/*.toml`, issue #16) build from the real registries, pass their `ready` checks,
//! and do what they are for: `python-data` reads a CSV with pandas, fits with scikit-learn and saves a matplotlib
//! figure (on the process tier and on gVisor), `node` runs TypeScript with tsx and tsc, `c` builds a CMake project.
//! The packages are the template's: the sandbox's interpreter reports the template's venv, not the host's.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Cli, Output};

/// `templates/NAME.toml` of this checkout.
fn spec(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../templates").join(format!("{name}.toml"))
}

/// Builds the built-in `name` into a new cache (under /var/tmp: sandboxes assemble their root under /tmp), asserting
/// the build and its `ready` check passed.
fn build(name: &str) -> tempfile::TempDir {
    let cache = tempfile::Builder::new().prefix("sk-builtin-templates-").tempdir_in("/var/tmp").expect("cache dir");
    let built = Cli::new([
        "template",
        "--cache",
        &cache.path().display().to_string(),
        "build",
        "--allow-registry-addresses",
        &spec(name).display().to_string(),
    ])
    .watchdog(Duration::from_secs(600))
    .output();
    assert_eq!(built.code, 0, "{}", built.describe());
    assert!(built.stderr_text().contains("(ok)"), "the ready check did not run: {}", built.describe());
    cache
}

/// `sandkasten run --template NAME [extra] -- bash -c SCRIPT` from `cache`.
fn run_in(cache: &Path, name: &str, extra: &[&str], script: &str) -> Output {
    let cache = cache.display().to_string();
    let mut args = vec!["--template-cache", &cache, "--template", name, "--timeout", "60s", "--memory", "1GiB"];
    args.extend(extra);
    args.extend(["--", "bash", "-c", script]);
    common::run(args).watchdog(Duration::from_secs(120)).output()
}

const DATA_SCRIPT: &str = r#"cat > data.csv <<'CSV'
x,y
1,2.1
2,3.9
3,6.2
4,7.8
CSV
python3 - <<'PY'
import sys
import pandas as pd
import matplotlib.pyplot as plt
from sklearn.linear_model import LinearRegression
data = pd.read_csv("data.csv")
print(data.describe().loc["mean"].round(2).to_dict())
model = LinearRegression().fit(data[["x"]], data["y"])
print("slope", round(float(model.coef_[0]), 1))
data.plot(x="x", y="y").get_figure().savefig("plot.png")
print("png", open("plot.png", "rb").read(4) == b"\x89PNG")
print(sys.prefix)
PY"#;

#[test]
fn python_data_reads_a_csv_fits_and_plots_with_its_own_packages() {
    require_root!();
    let cache = build("python-data");
    let check = |output: &Output| {
        assert_eq!(output.code, 0, "{}", output.describe());
        let printed = output.stdout_text();
        assert!(printed.contains("{'x': 2.5, 'y': 5.0}"), "{printed}");
        assert!(printed.contains("slope 1.9") && printed.contains("png True"), "{printed}");
        assert!(printed.contains("/opt/sandkasten-venv"), "not the template's Python: {printed}");
    };
    check(&run_in(cache.path(), "python-data", &[], DATA_SCRIPT));
    if let Some(why) = common::gvisor_unavailable() {
        eprintln!("skipped the gvisor part: {why}");
    } else {
        check(&run_in(cache.path(), "python-data", &["--isolation", "gvisor"], DATA_SCRIPT));
    }
}

#[test]
fn node_runs_typescript_with_tsx_and_tsc() {
    require_root!();
    let cache = build("node");
    let script = "printf 'const n: number = 6 * 7;\\nconsole.log(`answer ${n}`);\\n' > main.ts && tsx main.ts && \
                  tsc --outDir out main.ts && node out/main.js";
    let output = run_in(cache.path(), "node", &[], script);
    assert_eq!(output.code, 0, "{}", output.describe());
    assert_eq!(output.stdout_text(), "answer 42\nanswer 42\n", "{}", output.describe());
}

#[test]
fn c_builds_a_cmake_project() {
    require_root!();
    let cache = build("c");
    let script = "mkdir -p app && cd app && \
                  printf '#include <stdio.h>\\nint main(void) { printf(\"built by cmake\\\\n\"); return 0; }\\n' > main.c && \
                  printf 'cmake_minimum_required(VERSION 3.20)\\nproject(app C)\\nadd_executable(app main.c)\\n' \
                  > CMakeLists.txt && cmake -S . -B build > /dev/null && cmake --build build > /dev/null && ./build/app";
    let output = run_in(cache.path(), "c", &[], script);
    assert_eq!(output.code, 0, "{}", output.describe());
    assert_eq!(output.stdout_text(), "built by cmake\n", "{}", output.describe());
}
