//! The languages E2B's code interpreter names (`python`, `js`/`javascript`, `ts`/`typescript`, `bash`, `r`, `java`,
//! any case), normalised as E2B's server does, and mapped onto sandkasten's kernels (Python, JavaScript, bash, and
//! TypeScript, Java and R where the sandbox has the `typescript` package, a JDK or R). A language without its runtime
//! is a 400 that says what is missing: the runtime the template lacks (looked up in the sandbox, whose `/usr` is the
//! host's) and how to install it; a name E2B does not know is a 400 listing the ones it does.

use sandkasten_types::CodeLanguage;

use crate::e2b::auth::SandboxAccess;
use crate::e2b::error::E2bError;
use crate::state::AppState;

/// The runtime a kernel needs in the sandbox: the files that show it is installed, and what installs it.
struct Runtime {
    /// E2B's name for it.
    name: &'static str,
    /// Any one of these in the sandbox means the runtime is there.
    evidence: &'static [&'static str],
    /// What to install on the host to have it.
    install: &'static str,
}

/// TypeScript's kernel needs the `typescript` package in one of the places the JavaScript kernel loads it from.
const TYPESCRIPT: Runtime = Runtime {
    name: "typescript",
    evidence: &[
        "/usr/share/nodejs/typescript/package.json",
        "/usr/lib/node_modules/typescript/package.json",
        "/usr/local/lib/node_modules/typescript/package.json",
    ],
    install: "the typescript package on the server's host (Debian: apt-get install node-typescript; or npm install -g \
              typescript)",
};

/// Java's kernel needs a JDK (`jshell` comes with the `jdk.jshell` module the kernel uses; a JRE has neither), 17 or
/// newer (the kernel is run as a Java 17 source file).
const JAVA: Runtime = Runtime {
    name: "java",
    evidence: &["/usr/bin/jshell"],
    install: "a JDK (17 or newer) on the server's host (Debian: apt-get install openjdk-17-jdk-headless)",
};

/// R's kernel runs `R` (its `python3` driver is always there).
const R: Runtime = Runtime {
    name: "r",
    evidence: &["/usr/bin/R"],
    install: "R on the server's host (Debian: apt-get install r-base-core)",
};

/// E2B's normal form of a language name: trimmed, lowercase, `js` → `javascript`, `ts` → `typescript`.
fn normalized(name: Option<&str>) -> String {
    let name = name.map(|name| name.trim().to_ascii_lowercase()).unwrap_or_default();
    match name.as_str() {
        "" | "python3" => "python".to_owned(),
        "js" => "javascript".to_owned(),
        "ts" => "typescript".to_owned(),
        _ => name,
    }
}

/// The kernel for `name` (absent: Python), or a 400 saying why there is none.
pub(crate) async fn kernel_for(
    state: &AppState,
    access: &SandboxAccess,
    name: Option<&str>,
) -> Result<CodeLanguage, E2bError> {
    let name = normalized(name);
    match name.as_str() {
        "python" => Ok(CodeLanguage::Python),
        "javascript" => Ok(CodeLanguage::Javascript),
        "bash" => Ok(CodeLanguage::Bash),
        "typescript" => needing(state, access, &TYPESCRIPT, CodeLanguage::Typescript).await,
        "java" => needing(state, access, &JAVA, CodeLanguage::Java).await,
        "r" => needing(state, access, &R, CodeLanguage::R).await,
        _ => Err(E2bError::invalid(format!(
            "language {name:?} is not supported: use python, javascript (js), typescript (ts), bash, r or java"
        ))),
    }
}

/// `kernel` when `runtime` is in the sandbox, else a 400 naming what to install.
async fn needing(
    state: &AppState,
    access: &SandboxAccess,
    runtime: &Runtime,
    kernel: CodeLanguage,
) -> Result<CodeLanguage, E2bError> {
    match installed(state, access, runtime).await {
        true => Ok(kernel),
        false => Err(E2bError::invalid(format!(
            "language {:?} needs its runtime in the sandbox, which the template lacks: install {}",
            runtime.name, runtime.install
        ))),
    }
}

/// Whether any of `language`'s evidence is in the sandbox.
async fn installed(state: &AppState, access: &SandboxAccess, runtime: &Runtime) -> bool {
    for path in runtime.evidence {
        if state.runtime().stat(&access.id, path).await.is_ok() {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalised_as_e2b_does() {
        assert_eq!(normalized(None), "python");
        assert_eq!(normalized(Some(" JS ")), "javascript");
        assert_eq!(normalized(Some("TS")), "typescript");
        assert_eq!(normalized(Some("Python")), "python");
        assert_eq!(normalized(Some("r")), "r");
    }
}
