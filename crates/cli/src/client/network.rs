//! `sandbox create`'s network options, `sandbox network` (change a policy live), `sandbox egress` (the audit trail)
//! and `sandbox secret …` (the tenant's secrets; values are read from stdin, never from the command line).

use std::io::Read;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::client::commands::sandbox_path;
use crate::client::http::{Client, ClientError};
use crate::client::output;

/// A network policy on the command line.
#[derive(Debug, Clone, Args)]
pub struct NetworkArgs {
    /// none (loopback only), allowlist (only --allow hosts) or open (any public host). Default: allowlist when
    /// --allow is given, else none.
    #[arg(long, value_name = "MODE", value_parser = ["none", "allowlist", "open"])]
    pub network: Option<String>,
    /// A host the sandbox may reach: `api.example.com`, `*.example.org` (subdomains), optional `:PORT` (without one:
    /// every port; add :443 to allow only that). Repeatable.
    #[arg(long = "allow", value_name = "PATTERN")]
    pub allow: Vec<String>,
    /// A host never reached, whatever --allow says. Repeatable.
    #[arg(long = "deny", value_name = "PATTERN")]
    pub deny: Vec<String>,
}

impl NetworkArgs {
    /// The policy as the API's JSON; `None` when no network option was given.
    pub fn policy(&self) -> Option<Value> {
        if self.network.is_none() && self.allow.is_empty() && self.deny.is_empty() {
            return None;
        }
        let default = if self.allow.is_empty() { "none" } else { "allowlist" };
        let mode = self.network.as_deref().unwrap_or(default);
        Some(json!({"mode": mode, "allow": self.allow, "deny": self.deny}))
    }
}

/// `sandbox network ID ...`: replaces the policy of a running sandbox.
pub fn set_network(client: &Client, id: &str, args: &NetworkArgs, json: bool) -> Result<i32, ClientError> {
    let policy = args
        .policy()
        .ok_or_else(|| ClientError::input("give the new policy: --network MODE and/or --allow/--deny PATTERN"))?;
    let answer = client.put_json(&format!("{}/network", sandbox_path(id)?), &policy)?;
    if json {
        output::print_json(&answer);
    } else {
        println!("{}", describe_policy(&answer));
    }
    Ok(0)
}

/// One line for a policy: `allowlist: allow a, b; deny c`.
pub fn describe_policy(policy: &Value) -> String {
    let list = |key: &str| {
        policy[key].as_array().map(|items| items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", "))
    };
    let mut text = policy["mode"].as_str().unwrap_or("none").to_owned();
    if let Some(allow) = list("allow").filter(|s| !s.is_empty()) {
        text.push_str(&format!(": allow {allow}"));
    }
    if let Some(deny) = list("deny").filter(|s| !s.is_empty()) {
        text.push_str(&format!("; deny {deny}"));
    }
    text
}

/// `sandbox egress ID`: the audit trail, one attempt per line.
pub fn egress(client: &Client, id: &str, limit: Option<u32>, json: bool) -> Result<i32, ClientError> {
    let query: Vec<(String, String)> = limit.map(|n| ("limit".to_owned(), n.to_string())).into_iter().collect();
    let answer = client.get_json(&format!("{}/egress", sandbox_path(id)?), &query)?;
    if json {
        output::print_json(&answer);
        return Ok(0);
    }
    println!(
        "{:<24} {:<8} {:<7} {:<40} {:<16} {:>9} {:>9}  RULE",
        "TIME", "DECISION", "SCHEME", "HOST:PORT", "ADDRESS", "UP", "DOWN"
    );
    for event in answer["events"].as_array().into_iter().flatten() {
        let time = event["time_ms"].as_i64().map(sandkasten_server::clock::rfc3339).unwrap_or_default();
        println!(
            "{:<24} {:<8} {:<7} {:<40} {:<16} {:>9} {:>9}  {}",
            time,
            event["decision"].as_str().unwrap_or(""),
            event["scheme"].as_str().unwrap_or(""),
            format!("{}:{}", event["host"].as_str().unwrap_or(""), event["port"]),
            event["resolved"].as_str().unwrap_or("-"),
            event["bytes_up"],
            event["bytes_down"],
            event["rule"].as_str().unwrap_or(""),
        );
    }
    Ok(0)
}

/// `sandbox secret …`.
#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Create or replace a secret; its value is read from stdin (so it stays out of shell history and `ps`).
    Put {
        /// Name: also the environment variable holding its placeholder in sandboxes created with `--secret NAME`.
        name: String,
        /// A host the value may be sent to (same patterns as --allow), over HTTPS; name a plain port (`host:8080`) to
        /// allow plain HTTP to it. Repeatable; at least one.
        #[arg(long = "host", value_name = "PATTERN", required = true)]
        hosts: Vec<String>,
    },
    /// List the secrets (names and hosts; values are never shown).
    List {
        /// Print `{"secrets": [...]}` as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a secret.
    Rm {
        /// Name.
        name: String,
    },
}

/// Runs a `sandbox secret` subcommand.
pub fn secret(client: &Client, command: SecretCommand) -> Result<i32, ClientError> {
    match command {
        SecretCommand::Put { name, hosts } => {
            let mut value = String::new();
            std::io::stdin()
                .read_to_string(&mut value)
                .map_err(|e| ClientError::input(format!("cannot read the secret's value from stdin: {e}")))?;
            let value = value.strip_suffix('\n').unwrap_or(&value).to_owned();
            let answer = client.put_json(&secret_path(&name)?, &json!({"value": value, "hosts": hosts}))?;
            println!("{}", answer["name"].as_str().unwrap_or(&name));
        }
        SecretCommand::List { json } => {
            let answer = client.get_json("/v1/secrets", &[])?;
            if json {
                output::print_json(&answer);
            } else {
                for secret in answer["secrets"].as_array().into_iter().flatten() {
                    let hosts: Vec<&str> =
                        secret["hosts"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                    println!("{:<32} {}", secret["name"].as_str().unwrap_or(""), hosts.join(", "));
                }
            }
        }
        SecretCommand::Rm { name } => client.delete(&secret_path(&name)?)?,
    }
    Ok(0)
}

fn secret_path(name: &str) -> Result<String, ClientError> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(ClientError::input(format!(
            "secret name {name:?} is invalid: use letters, digits and '_' (it becomes an environment variable)"
        )));
    }
    Ok(format!("/v1/secrets/{name}"))
}
