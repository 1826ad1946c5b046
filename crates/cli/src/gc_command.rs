//! `sandkasten gc`: remove the leftovers (cgroups, records) of sandboxes whose owner died.

use sandkasten_cgroups::Hierarchy;
use sandkasten_runtime::{RuntimeConfig, gc};

use crate::exit_codes;

/// Runs a collection and prints what it removed.
pub fn run(json: bool) -> i32 {
    let config = RuntimeConfig::default();
    let outcome = Hierarchy::detect()
        .map_err(|e| e.to_string())
        .and_then(|hierarchy| gc::collect(&config, &hierarchy).map_err(|e| e.to_string()));
    match outcome {
        Ok(report) => {
            if json {
                let value = serde_json::json!({
                    "removed": report.removed,
                    "unreadable": report.unreadable,
                    "live": report.live,
                });
                println!("{value}");
            } else {
                println!(
                    "removed {} sandbox(es){}; {} still running",
                    report.removed.len(),
                    if report.removed.is_empty() { String::new() } else { format!(": {}", report.removed.join(", ")) },
                    report.live
                );
                for path in &report.unreadable {
                    println!("unreadable record left in place: {path}");
                }
            }
            0
        }
        Err(message) => {
            eprintln!("sandkasten: gc failed: {message}");
            exit_codes::SANDBOX_ERROR
        }
    }
}
