//! The committed JSON schema of template specs (`docs/template.schema.json`) matches the spec's types.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

const REGENERATE: &str = "SANDKASTEN_UPDATE_TEMPLATE_SCHEMA=1 cargo test -p sandkasten-template --test schema";

#[test]
fn committed_template_schema_matches_the_types() {
    let mut generated = serde_json::to_string_pretty(&sandkasten_template::spec::json_schema()).unwrap();
    generated.push('\n');
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/template.schema.json");
    if std::env::var_os("SANDKASTEN_UPDATE_TEMPLATE_SCHEMA").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date with the spec's types; regenerate it with:\n    {REGENERATE}\nand commit the result",
        path.display()
    );
}
