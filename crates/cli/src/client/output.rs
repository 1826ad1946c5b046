//! Human output of the client: sandboxes as a table (`list`) or as aligned `key: value` lines (`info`), sizes and
//! durations in units; `--json` output is the server's JSON, one object per line.

use serde_json::Value;

use sandkasten_types::units::{format_bytes, format_duration_ms};

/// Prints `value` as one line of JSON.
pub fn print_json(value: &Value) {
    println!("{value}");
}

fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn bytes(value: &Value) -> String {
    value.as_u64().map(format_bytes).unwrap_or_else(|| text(value))
}

/// `k=v, k2=v2` of a JSON object of strings.
fn pairs(value: &Value) -> String {
    let Some(map) = value.as_object() else { return String::new() };
    map.iter().map(|(key, value)| format!("{key}={}", text(value))).collect::<Vec<_>>().join(",")
}

/// The rows of `sandbox list`, with a header, columns padded to their widest cell.
pub fn table(sandboxes: &[Value]) -> String {
    let header = ["ID", "STATE", "ISOLATION", "CREATED", "EXPIRES", "MEMORY", "METADATA"].map(str::to_owned);
    let mut rows = vec![header.to_vec()];
    for sandbox in sandboxes {
        rows.push(vec![
            text(&sandbox["id"]),
            text(&sandbox["state"]),
            text(&sandbox["isolation"]),
            text(&sandbox["created_at"]),
            text(&sandbox["expires_at"]),
            bytes(&sandbox["limits"]["memory_bytes"]),
            pairs(&sandbox["metadata"]),
        ]);
    }
    let columns = rows[0].len();
    let widths: Vec<usize> =
        (0..columns).map(|c| rows.iter().map(|row| row[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `sandbox info`: one `key: value` line per field, values aligned.
pub fn details(sandbox: &Value) -> String {
    let limits = &sandbox["limits"];
    let env: Vec<String> =
        sandbox["env_names"].as_array().map(|names| names.iter().map(text).collect()).unwrap_or_default();
    let mut lines = vec![
        ("id", text(&sandbox["id"])),
        ("tenant", text(&sandbox["tenant"])),
        ("state", text(&sandbox["state"])),
        ("isolation", text(&sandbox["isolation"])),
        ("template", text(&sandbox["template"])),
        ("created", text(&sandbox["created_at"])),
        ("expires", text(&sandbox["expires_at"])),
    ];
    if !sandbox["ended_at"].is_null() {
        lines.push(("ended", text(&sandbox["ended_at"])));
        lines.push(("end reason", text(&sandbox["end_reason"])));
    }
    lines.extend([
        ("command timeout", limits["timeout_ms"].as_u64().map(format_duration_ms).unwrap_or_default()),
        ("memory", bytes(&limits["memory_bytes"])),
        ("cpus", text(&limits["cpus"])),
        ("pids", text(&limits["pids"])),
        ("disk", bytes(&limits["disk_bytes"])),
        ("output limit", bytes(&limits["output_bytes"])),
        ("env", env.join(", ")),
        ("metadata", pairs(&sandbox["metadata"])),
    ]);
    let width = lines.iter().map(|(key, _)| key.len() + 1).max().unwrap_or(0);
    lines
        .into_iter()
        .map(|(key, value)| format!("{:<width$} {value}", format!("{key}:")).trim_end().to_owned() + "\n")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox() -> Value {
        serde_json::json!({
            "id": "sb-0123456789abcdef", "tenant": "t1", "state": "running", "isolation": "gvisor", "template": "host",
            "created_at": "2025-01-01T00:00:00Z", "expires_at": "2025-01-01T00:05:00Z",
            "limits": {"timeout_ms": 10000, "memory_bytes": 268435456, "cpus": 1.0, "pids": 128,
                       "disk_bytes": 134217728, "output_bytes": 1048576},
            "metadata": {"owner": "me"}, "env_names": ["A", "B"]
        })
    }

    #[test]
    fn the_table_has_a_header_and_aligned_columns() {
        let table = table(&[sandbox()]);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("ID  ") && lines[0].contains("METADATA"), "{table}");
        assert!(lines[1].starts_with("sb-0123456789abcdef  running"), "{table}");
        assert_eq!(lines[0].find("STATE"), lines[1].find("running"));
        assert_eq!(lines[0].find("ISOLATION"), lines[1].find("gvisor"));
        assert!(lines[1].ends_with("owner=me"), "{table}");
    }

    #[test]
    fn details_are_aligned_key_value_lines() {
        let text = details(&sandbox());
        assert!(text.contains("id:              sb-0123456789abcdef\n"), "{text}");
        assert!(text.contains("env:             A, B\n"), "{text}");
        assert!(text.contains("isolation:       gvisor\n"), "{text}");
        assert!(!text.contains("ended"), "{text}");
        let starts: Vec<usize> = text
            .lines()
            .filter_map(|line| {
                let colon = line.find(':')?;
                let rest = &line[colon + 1..];
                (!rest.trim().is_empty()).then_some(colon + 1 + rest.len() - rest.trim_start().len())
            })
            .collect();
        assert!(starts.windows(2).all(|w| w[0] == w[1]), "{text}");
    }
}
