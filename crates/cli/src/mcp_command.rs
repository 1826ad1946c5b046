//! `sandkasten mcp --server URL`: MCP over stdio for desktop clients, as a relay to the server's `/mcp` (the tools
//! exist once, on the server). JSON-RPC messages from stdin go to the server over streamable HTTP (rmcp's client
//! transport, with `Authorization: Bearer $SANDKASTEN_API_KEY`), the server's to stdout, one per line; when stdin
//! closes the relay ends the HTTP session (`DELETE /mcp`), so the server kills the sandboxes it created.

use std::future::Future;
use std::pin::Pin;

use anyhow::{Context, bail};
use rmcp::RoleServer;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

use crate::exit_codes;

/// `sandkasten mcp`.
#[derive(Debug, clap::Args)]
#[command(after_help = "The API key is read from SANDKASTEN_API_KEY. Logs go to stderr; stdout carries only \
    MCP messages.")]
pub struct McpArgs {
    /// The server: its base URL (`/mcp` is added) or the full URL of its MCP endpoint.
    #[arg(long, env = "SANDKASTEN_URL")]
    server: String,
}

/// Runs the relay until stdin closes or the server ends the session.
pub fn run(args: McpArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sandkasten: mcp: cannot start the async runtime: {error}");
            return exit_codes::SANDBOX_ERROR;
        }
    };
    match runtime.block_on(relay(args)) {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("sandkasten: mcp: {error:#}");
            exit_codes::SANDBOX_ERROR
        }
    }
}

/// The endpoint: `URL` as given when it names a path, else `URL/mcp`.
fn endpoint(server: &str) -> anyhow::Result<String> {
    let server = server.trim_end_matches('/');
    let Some((_, rest)) = server.split_once("://") else {
        bail!("--server {server:?} is not a URL: give http://HOST:PORT")
    };
    Ok(if rest.contains('/') { server.to_owned() } else { format!("{server}/mcp") })
}

type Sending = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

async fn relay(args: McpArgs) -> anyhow::Result<()> {
    let key = std::env::var("SANDKASTEN_API_KEY").context("SANDKASTEN_API_KEY is not set (the server's API key)")?;
    // https needs a crypto provider; ring is the workspace's (a second install is refused, which is fine).
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let config = StreamableHttpClientTransportConfig::with_uri(endpoint(&args.server)?).auth_header(key);
    let mut server = StreamableHttpClientTransport::from_config(config);
    let mut client = AsyncRwTransport::<RoleServer, _, _>::new_server(tokio::io::stdin(), tokio::io::stdout());
    // One message to the server at a time, in order; meanwhile the server's messages keep flowing to stdout.
    let mut sending: Option<Sending> = None;
    let outcome = loop {
        tokio::select! {
            sent = async {
                match sending.as_mut() {
                    Some(send) => send.await,
                    None => std::future::pending().await,
                }
            }, if sending.is_some() => {
                sending = None;
                if let Err(error) = sent {
                    break Err(anyhow::anyhow!("sending to the server: {error}"));
                }
            }
            message = client.receive(), if sending.is_none() => match message {
                Some(message) => {
                    let send = server.send(message);
                    sending = Some(Box::pin(async move { send.await.map_err(|e| e.to_string()) }));
                }
                None => break Ok(()),
            },
            message = server.receive() => match message {
                Some(message) => client.send(message).await.context("writing to stdout")?,
                None => break Err(anyhow::anyhow!("the server ended the MCP session (see its answer above, or \
                    check --server and SANDKASTEN_API_KEY)")),
            },
        }
    };
    // Ends the session on the server (DELETE), which kills what it created.
    server.close().await.ok();
    outcome
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_endpoint_is_the_servers_mcp_path_unless_a_path_is_given() {
        assert_eq!(super::endpoint("http://h:8080").ok().as_deref(), Some("http://h:8080/mcp"));
        assert_eq!(super::endpoint("http://h:8080/").ok().as_deref(), Some("http://h:8080/mcp"));
        assert_eq!(super::endpoint("https://h/sk/mcp").ok().as_deref(), Some("https://h/sk/mcp"));
        assert!(super::endpoint("h:8080").is_err());
    }
}
