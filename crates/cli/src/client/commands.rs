//! `sandbox create`, `list`, `info` and `rm`, and the parsing of their `KEY=VALUE` options and limits.

use serde_json::{Map, Value};

use sandkasten_types::Tier;
use sandkasten_types::units::{parse_bytes, parse_duration_ms};

use crate::client::LimitArgs;
use crate::client::http::{Client, ClientError};
use crate::client::output;

/// What `sandbox create` asks for.
#[derive(Debug, clap::Args)]
pub struct CreateOptions {
    /// Isolation tier: process (namespaces, seccomp, landlock; shares the host kernel) or gvisor (a user-space
    /// kernel between the code and the host's; needs runsc on the server). Default: the server's.
    #[arg(long, value_name = "TIER", value_parser = super::isolation_parser())]
    pub isolation: Option<Tier>,
    /// Seconds until the server destroys the sandbox (default: the server's, 300).
    #[arg(long = "timeout-s", value_name = "N")]
    pub timeout_s: Option<u64>,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Environment variable of every command (KEY=VALUE, or KEY to pass this shell's value). Repeatable.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// A label to find the sandbox by (KEY=VALUE). Repeatable.
    #[arg(long = "metadata", value_name = "KEY=VALUE")]
    pub metadata: Vec<String>,
    #[command(flatten)]
    pub network: crate::client::network::NetworkArgs,
    /// A secret of yours (`sandbox secret put`) to expose as a placeholder in $NAME; the egress proxy puts the
    /// real value in requests to the secret's hosts only. Repeatable.
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Start on a snapshot's files (`sandbox snapshot`): its sandbox's isolation and limits unless given here.
    #[arg(long = "from", value_name = "SNAPSHOT")]
    pub from: Option<String>,
    /// The template: `host` (default), `e2b`, or a template built on the server (`[templates] cache`): its
    /// packages read-only at `/opt`, its environment under `--env`.
    #[arg(long, value_name = "NAME")]
    pub template: Option<String>,
}

/// `KEY=VALUE` items as a JSON object; `flag` names the option in messages.
pub fn pairs(flag: &str, items: &[String]) -> Result<Map<String, Value>, ClientError> {
    let mut map = Map::new();
    for item in items {
        let (key, value) = item
            .split_once('=')
            .filter(|(key, _)| !key.is_empty())
            .ok_or_else(|| ClientError::input(format!("{flag} '{item}' is not KEY=VALUE")))?;
        map.insert(key.to_owned(), Value::String(value.to_owned()));
    }
    Ok(map)
}

/// `--env` items: `KEY=VALUE`, or `KEY` for this shell's value.
pub fn environment(items: &[String]) -> Result<Map<String, Value>, ClientError> {
    let mut map = Map::new();
    for item in items {
        let (key, value) = match item.split_once('=') {
            Some((key, value)) => (key.to_owned(), value.to_owned()),
            None => {
                let value = std::env::var(item).map_err(|_| {
                    ClientError::input(format!("--env {item}: no such variable in this shell; use --env {item}=VALUE"))
                })?;
                (item.clone(), value)
            }
        };
        if key.is_empty() {
            return Err(ClientError::input(format!("--env '{item}' is not KEY=VALUE with a non-empty KEY")));
        }
        map.insert(key, Value::String(value));
    }
    Ok(map)
}

fn limits(args: &LimitArgs) -> Result<Map<String, Value>, ClientError> {
    let mut limits = Map::new();
    let size = |flag: &str, text: &str| parse_bytes(text).map_err(|e| ClientError::input(format!("{flag}: {e}")));
    if let Some(memory) = &args.memory {
        limits.insert("memory_bytes".into(), size("--memory", memory)?.into());
    }
    if let Some(disk) = &args.disk {
        limits.insert("disk_bytes".into(), size("--disk", disk)?.into());
    }
    if let Some(cpus) = args.cpus {
        limits.insert("cpus".into(), cpus.into());
    }
    if let Some(pids) = args.pids {
        limits.insert("pids".into(), pids.into());
    }
    if let Some(timeout) = &args.command_timeout {
        let ms = parse_duration_ms(timeout).map_err(|e| ClientError::input(format!("--command-timeout: {e}")))?;
        limits.insert("timeout_ms".into(), ms.into());
    }
    Ok(limits)
}

/// `sandbox create`: prints the new id (or the sandbox as JSON).
pub fn create(client: &Client, options: CreateOptions, json: bool) -> Result<i32, ClientError> {
    let mut body = Map::new();
    if let Some(template) = &options.template {
        body.insert("template".into(), template.clone().into());
    }
    if let Some(tier) = options.isolation {
        body.insert("isolation".into(), tier.name().into());
    }
    let limits = limits(&options.limits)?;
    if !limits.is_empty() {
        body.insert("limits".into(), Value::Object(limits));
    }
    body.insert("env".into(), Value::Object(environment(&options.env)?));
    body.insert("metadata".into(), Value::Object(pairs("--metadata", &options.metadata)?));
    if let Some(timeout_s) = options.timeout_s {
        body.insert("timeout_s".into(), timeout_s.into());
    }
    if let Some(policy) = options.network.policy() {
        body.insert("network".into(), policy);
    }
    if !options.secrets.is_empty() {
        body.insert("secrets".into(), options.secrets.clone().into());
    }
    let sandbox = match &options.from {
        Some(snapshot) => {
            body.insert("snapshot".into(), snapshot.clone().into());
            crate::client::snapshots::create_from(client, snapshot, &Value::Object(body))?
        }
        None => client.post_json("/v1/sandboxes", &Value::Object(body))?,
    };
    if json {
        output::print_json(&sandbox);
    } else {
        println!("{}", sandbox["id"].as_str().unwrap_or_default());
    }
    Ok(0)
}

/// `sandbox list`: every page of `GET /v1/sandboxes`, `page_size` at a time, each after the previous one's cursor.
pub fn list(client: &Client, metadata: &[String], all: bool, page_size: u16, json: bool) -> Result<i32, ClientError> {
    let mut query: Vec<(String, String)> = pairs("--metadata", metadata)?
        .into_iter()
        .map(|(key, value)| (format!("metadata.{key}"), value.as_str().unwrap_or_default().to_owned()))
        .collect();
    if all {
        query.push(("state".into(), "all".into()));
    }
    query.push(("limit".into(), page_size.to_string()));
    let mut sandboxes = Vec::new();
    loop {
        let answer = client.get_json("/v1/sandboxes", &query)?;
        sandboxes.extend(answer["sandboxes"].as_array().cloned().unwrap_or_default());
        let Some(cursor) = answer["next_cursor"].as_str() else { break };
        query.retain(|(key, _)| key != "cursor");
        query.push(("cursor".into(), cursor.to_owned()));
    }
    if json {
        output::print_json(&serde_json::json!({ "sandboxes": sandboxes }));
    } else {
        print!("{}", output::table(&sandboxes));
    }
    Ok(0)
}

/// The API path of sandbox `id`; an id that cannot be one is refused here (it could change the path).
pub fn sandbox_path(id: &str) -> Result<String, ClientError> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(ClientError::input(format!("'{id}' is not a sandbox id (sb- and 16 hex digits)")));
    }
    Ok(format!("/v1/sandboxes/{id}"))
}

/// `sandbox info`.
pub fn info(client: &Client, id: &str, json: bool) -> Result<i32, ClientError> {
    let sandbox = client.get_json(&sandbox_path(id)?, &[])?;
    if json {
        output::print_json(&sandbox);
    } else {
        print!("{}", output::details(&sandbox));
    }
    Ok(0)
}

/// `sandbox pause` (in `pause_mode`) / `resume` (`None`): each sandbox in turn, its id printed when done, failures
/// reported one by one; exit 0 only when all went.
pub fn set_paused(client: &Client, ids: &[String], pause_mode: Option<&str>) -> Result<i32, ClientError> {
    let (action, body) = match pause_mode {
        Some(mode) => ("pause", serde_json::json!({ "mode": mode })),
        None => ("resume", Value::Null),
    };
    let mut code = 0;
    for id in ids {
        match sandbox_path(id).and_then(|path| client.post_json(&format!("{path}/{action}"), &body)) {
            Ok(_) => println!("{id}"),
            Err(error) => {
                eprintln!("sandkasten: {}", error.message);
                code = code.max(error.exit_code);
            }
        }
    }
    Ok(code)
}

/// `sandbox rm`: destroys each sandbox, reporting failures one by one; exit 0 only when all went.
pub fn remove(client: &Client, ids: &[String]) -> Result<i32, ClientError> {
    let mut code = 0;
    for id in ids {
        match sandbox_path(id).and_then(|path| client.delete(&path)) {
            Ok(()) => println!("{id}"),
            Err(error) => {
                eprintln!("sandkasten: {}", error.message);
                code = code.max(error.exit_code);
            }
        }
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pairs_need_a_key_and_an_equals_sign() {
        let items = vec!["a=1".to_owned(), "b=x=y".to_owned(), "c=".to_owned()];
        let map = pairs("--metadata", &items).map_err(|e| e.message);
        assert_eq!(map.map(Value::Object), Ok(json!({"a": "1", "b": "x=y", "c": ""})));
        assert!(pairs("--metadata", &["novalue".to_owned()]).is_err());
        assert!(pairs("--metadata", &["=v".to_owned()]).is_err());
    }

    #[test]
    fn ids_that_would_change_the_path_are_refused() {
        assert_eq!(sandbox_path("sb-0123456789abcdef").ok().as_deref(), Some("/v1/sandboxes/sb-0123456789abcdef"));
        for bad in ["", "../x", "sb-1/exec", "a?b", "a b"] {
            assert!(sandbox_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_are_parsed_with_units() {
        let args = LimitArgs {
            memory: Some("64MiB".into()),
            cpus: Some(0.5),
            pids: None,
            disk: None,
            command_timeout: Some("2s".into()),
        };
        let parsed = limits(&args).map_err(|e| e.message).map(Value::Object);
        assert_eq!(parsed, Ok(json!({"memory_bytes": 64 << 20, "cpus": 0.5, "timeout_ms": 2000})));
        let bad = LimitArgs { memory: Some("lots".into()), cpus: None, pids: None, disk: None, command_timeout: None };
        assert!(limits(&bad).err().is_some_and(|e| e.message.starts_with("--memory")));
    }
}
