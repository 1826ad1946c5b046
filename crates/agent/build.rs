//! Builds the `sudo` client the agent installs in every sandbox (`crates/sudo/src/main.rs`) with the same `rustc`:
//! a static executable without crates, so that it runs in any template's root whatever its C library, small
//! (optimised for size, no unwinding, no symbols). The agent embeds it (`serve::sudo`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = PathBuf::from("../sudo/src/main.rs");
    println!("cargo::rerun-if-changed={}", source.display());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("sandkasten-sudo");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut command = Command::new(rustc);
    command.args(["--edition", "2024", "--crate-name", "sandkasten_sudo", "--crate-type", "bin"]);
    for flag in
        ["opt-level=z", "panic=abort", "strip=symbols", "codegen-units=1", "lto=fat", "target-feature=+crt-static"]
    {
        command.args(["-C", flag]);
    }
    let (target, host) = (std::env::var("TARGET").unwrap_or_default(), std::env::var("HOST").unwrap_or_default());
    if !target.is_empty() && target != host {
        command.args(["--target", &target]);
    }
    command.arg("-o").arg(&out).arg(&source);
    match command.status() {
        Ok(status) if status.success() => {}
        Ok(status) => panic!("building the sudo client ({}) failed: {status}", source.display()),
        Err(error) => panic!("running rustc for the sudo client: {error}"),
    }
}
