//! The import graph checked against a language's policy: every literal import (`import x`, `from x import y`,
//! `__import__("x")`, `importlib.import_module("x")`, `require("x")`, `import … from "x"`, `import("x")`) against
//! `deny_imports`, then `allow_imports`; a computed module name is a `dynamic_import` of its own.

use crate::findings::{Findings, Position};
use crate::policy::ImportPolicy;
use crate::rules::{DYNAMIC_IMPORT, DYNAMIC_IMPORT_UNCHECKED, IMPORT_DENIED, IMPORT_NOT_ALLOWED};

/// One import the walk saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Import {
    /// The module, or `None` when its name is computed at run time.
    pub(crate) module: Option<String>,
    /// Where.
    pub(crate) at: Position,
    /// How it was written (`import`, `require`, `__import__`, ...), for the message.
    pub(crate) how: &'static str,
}

/// Whether a module name is a relative one (a file of the program itself), which the policy does not cover.
fn is_relative(module: &str) -> bool {
    module.starts_with('.') || module.starts_with('/')
}

/// Adds the findings of `imports` under `policy`.
pub(crate) fn check(imports: &[Import], policy: &ImportPolicy, findings: &mut Findings) {
    for import in imports {
        match &import.module {
            None => {
                let rule = if policy.allow_imports.is_some() { &DYNAMIC_IMPORT_UNCHECKED } else { &DYNAMIC_IMPORT };
                findings.push(rule, import.at, format!("{} with a computed module name", import.how));
            }
            Some(module) if is_relative(module) => {}
            Some(module) if policy.denies(module) => {
                findings.push(&IMPORT_DENIED, import.at, format!("{} of '{module}'", import.how));
            }
            Some(module) if !policy.allows(module) => {
                findings.push(&IMPORT_NOT_ALLOWED, import.at, format!("{} of '{module}'", import.how));
            }
            Some(_) => {}
        }
    }
}
