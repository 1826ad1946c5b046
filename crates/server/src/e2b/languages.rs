//! The languages E2B's code interpreter names (`python`, `js`/`javascript`, `ts`/`typescript`, `bash`, `r`, `java`,
//! any case), normalised as E2B's server does, and mapped onto sandkasten's kernels (Python, JavaScript, bash, and
//! TypeScript and Java where the sandbox has the `typescript` package or a JDK). A language without its runtime or
//! without a kernel is a 400 that says what is missing: the runtime the template lacks (looked up in the sandbox,
//! whose `/usr` is the host's) and how to install it, or, when the runtime is there, that no kernel drives it yet.

use sandkasten_types::CodeLanguage;

use crate::e2b::auth::SandboxAccess;
use crate::e2b::error::E2bError;
use crate::state::AppState;

/// A language without a sandkasten kernel: the files that show its runtime is installed, and what installs it.
struct Missing {
    /// E2B's name for it.
    name: &'static str,
    /// Any one of these in the sandbox means the runtime is there.
    evidence: &'static [&'static str],
    /// What to install on the host to have it.
    install: &'static str,
}

/// TypeScript's kernel needs the `typescript` package in one of the places the JavaScript kernel loads it from.
const TYPESCRIPT: Missing = Missing {
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
const JAVA: Missing = Missing {
    name: "java",
    evidence: &["/usr/bin/jshell"],
    install: "a JDK (17 or newer) on the server's host (Debian: apt-get install openjdk-17-jdk-headless)",
};

const MISSING: [Missing; 1] = [Missing {
    name: "r",
    evidence: &["/usr/bin/Rscript", "/usr/lib/R/bin/R"],
    install: "R on the server's host (Debian: apt-get install r-base)",
}];

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
        "python" => return Ok(CodeLanguage::Python),
        "javascript" => return Ok(CodeLanguage::Javascript),
        "bash" => return Ok(CodeLanguage::Bash),
        "typescript" => return needing(state, access, &TYPESCRIPT, CodeLanguage::Typescript).await,
        "java" => return needing(state, access, &JAVA, CodeLanguage::Java).await,
        _ => {}
    }
    let Some(missing) = MISSING.iter().find(|missing| missing.name == name) else {
        return Err(E2bError::invalid(format!(
            "language {name:?} is not supported: use python, javascript (js), typescript (ts), bash, r or java"
        )));
    };
    Err(E2bError::invalid(if installed(state, access, missing).await {
        format!(
            "language {name:?}: its runtime is installed, but sandkasten has no {name} kernel yet: use python, \
             javascript, typescript, bash or java"
        )
    } else {
        format!(
            "language {name:?} needs its runtime in the sandbox, which the template lacks: install {}",
            missing.install
        )
    }))
}

/// `kernel` when `runtime` is in the sandbox, else a 400 naming what to install.
async fn needing(
    state: &AppState,
    access: &SandboxAccess,
    runtime: &Missing,
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
async fn installed(state: &AppState, access: &SandboxAccess, language: &Missing) -> bool {
    for path in language.evidence {
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
