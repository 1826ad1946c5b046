//! The server's module layering: dependencies point one way, `api`/`e2b` → `lifecycle` → store, runtime, egress and
//! the pools' bookkeeping. `lifecycle` never names an HTTP handler module, and no file of the crate reaches itself
//! through its imports (once, handlers called each other for lifecycle work and 34 files formed one import circle).

use std::collections::{BTreeMap, BTreeSet};

use crate::imports::{Graph, Module, code_of, source_dir};

fn module(path: &str) -> Module {
    path.split('/').filter(|part| !part.is_empty()).map(str::to_owned).collect()
}

fn under(module: &Module, top: &str) -> bool {
    module.first().is_some_and(|first| first == top)
}

#[test]
fn lifecycle_never_names_the_api_or_the_e2b_facade() {
    let dir = source_dir().join("lifecycle");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let code = code_of(&std::fs::read_to_string(&path).unwrap());
        for forbidden in ["crate::api", "crate::e2b", "super::super"] {
            assert!(
                !code.contains(forbidden),
                "{} names {forbidden}: lifecycle must not depend on handlers",
                path.display()
            );
        }
        checked += 1;
    }
    assert!(checked >= 5, "positive control: the lifecycle files were read ({checked})");
    let graph = Graph::read();
    for (from, named) in graph.edges.iter().filter(|(from, _)| under(from, "lifecycle")) {
        for to in named.iter().filter(|to| under(to, "api") || under(to, "e2b")) {
            // Sessions (the facade's tokens) live in the state; ending a sandbox closes its session through it.
            assert!(to == &module("e2b/sessions"), "{} imports {}", graph.file(from), graph.file(to));
        }
    }
}

#[test]
fn the_api_and_the_facade_start_and_end_sandboxes_through_lifecycle() {
    let graph = Graph::read();
    let names = |from: &str, to: &str| graph.edges.get(&module(from)).is_some_and(|named| named.contains(&module(to)));
    // Positive controls: the scanner sees these imports, so an empty graph cannot pass the cycle test.
    assert!(names("api/sandboxes", "lifecycle"), "{:?}", graph.edges.get(&module("api/sandboxes")));
    assert!(names("e2b/control", "lifecycle"));
    assert!(names("lifecycle/start", "store"));
    assert!(names("api", "api/sandboxes"), "paths through a child module are seen");
    // Once, these called the create/delete handlers' module (or `api::destroy_quietly`) to start and end sandboxes.
    for caller in ["api/run/task", "api/pools", "api/extract", "e2b/control", "e2b/auth", "pool"] {
        for handler in ["api/sandboxes", "api"] {
            assert!(!names(caller, handler), "{caller} imports {handler} for lifecycle work: call lifecycle instead");
        }
    }
}

#[test]
fn the_server_crate_has_no_import_cycle() {
    let graph = Graph::read();
    assert!(graph.files.len() > 60, "positive control: every file was read ({})", graph.files.len());
    if let Some(cycle) = graph.cycle() {
        let files: Vec<String> = cycle.iter().map(|m| graph.file(m)).collect();
        panic!("import cycle of {} files: {}", files.len(), files.join(" → "));
    }
}

#[test]
fn a_cycle_is_found_and_named() {
    let files = ["a", "b", "c"].map(|name| (module(name), format!("{name}.rs").into())).into_iter().collect();
    let edge = |from: &str, to: &[&str]| (module(from), to.iter().map(|t| module(t)).collect::<BTreeSet<_>>());
    let edges: BTreeMap<_, _> = [edge("a", &["b"]), edge("b", &["c"]), edge("c", &["b"])].into_iter().collect();
    let graph = Graph { files, edges };
    assert_eq!(graph.cycle(), Some(vec![module("b"), module("c")]));
    let acyclic = Graph { edges: [edge("a", &["b", "c"]), edge("b", &["c"])].into_iter().collect(), ..graph };
    assert_eq!(acyclic.cycle(), None);
}

#[test]
fn comments_strings_and_tests_are_not_imports() {
    let code = code_of(
        "use crate::a; // crate::b\n/* crate::c */ let s = \"crate::d\"; let r = r#\"crate::e\"#; let c = '\"';\n\
         use crate::f;\n#[cfg(test)]\nmod tests { use crate::g; }",
    );
    assert!(code.contains("crate::a") && code.contains("crate::f"), "{code}");
    for hidden in ["crate::b", "crate::c", "crate::d", "crate::e", "crate::g"] {
        assert!(!code.contains(hidden), "{hidden} in {code}");
    }
}
