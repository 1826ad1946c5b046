//! Prints the syntax tree of a file (for writing rules): `cargo run -p sandkasten-scan --example dump -- LANG FILE`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let language: tree_sitter::Language = match args.get(1).map(String::as_str) {
        Some("python") => tree_sitter_python::LANGUAGE.into(),
        Some("javascript") => tree_sitter_javascript::LANGUAGE.into(),
        _ => tree_sitter_bash::LANGUAGE.into(),
    };
    let code = std::fs::read_to_string(args.get(2).ok_or("give LANG FILE")?)?;
    let mut parser = tree_sitter::Parser::new();
    parser.set_language(&language)?;
    let tree = parser.parse(&code, None).ok_or("no tree")?;
    let mut cursor = tree.walk();
    let mut depth = 0usize;
    loop {
        let node = cursor.node();
        let field = cursor.field_name().map(|f| format!("{f}: ")).unwrap_or_default();
        let text = if node.child_count() == 0 { format!(" {:?}", &code[node.byte_range()]) } else { String::new() };
        println!("{}{field}{}{text}", "  ".repeat(depth), node.kind());
        if cursor.goto_first_child() {
            depth += 1;
            continue;
        }
        loop {
            if cursor.goto_next_sibling() {
                break;
            }
            if !cursor.goto_parent() {
                return Ok(());
            }
            depth -= 1;
        }
    }
}
