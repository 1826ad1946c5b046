//! The host end of port streams: `AgentClient::open_port` asks the agent to connect to `127.0.0.1:port` inside the
//! sandbox and hands the caller one end of an in-memory duplex pipe whose other end two tasks carry over the channel
//! (`PortData` both ways, `PortAck` as bytes are passed on, `PortEof` for a half-close, `PortClose` when the caller's
//! end goes away). Flow control is the protocol's window: at most `PORT_WINDOW_BYTES` per direction are in flight,
//! so a slow caller holds the sandbox's program (its writes wait), never the host's memory.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sandkasten_protocol::{MAX_PORT_CHUNK_BYTES, Message, PORT_WINDOW_BYTES};
use sandkasten_types::Failure;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::{Semaphore, mpsc};

use super::{AgentClient, sandbox_gone, unexpected};

/// The caller's end of a port stream: bytes written to it reach the connection inside the sandbox, bytes the
/// program there sends can be read from it; shutting down its write side is a half-close, dropping it closes the
/// connection.
pub type PortStream = DuplexStream;

impl AgentClient {
    /// Connects to `127.0.0.1:port` inside the sandbox (its own network namespace or network stack: never the
    /// host's) and returns the stream once connected. Nothing listening there is `NothingListening`; a sandbox with
    /// `MAX_PORT_STREAMS` open is `Conflict`.
    pub async fn open_port(self: &Arc<Self>, port: u16) -> Result<PortStream, Failure> {
        let (id, mut replies) = self.start(Message::PortOpen { port }).await?;
        match replies.recv().await {
            Some(Message::Done) => {}
            other => {
                self.finish(id);
                return Err(match other {
                    Some(Message::Failed(failure)) => failure,
                    Some(other) => unexpected(&other),
                    None => sandbox_gone(),
                });
            }
        }
        let (caller, ours) = tokio::io::duplex(MAX_PORT_CHUNK_BYTES);
        let (from_caller, to_caller) = tokio::io::split(ours);
        let window = Arc::new(Semaphore::new(PORT_WINDOW_BYTES as usize));
        let outbound = tokio::spawn(send_to_agent(Arc::clone(self), id, from_caller, Arc::clone(&window)));
        let client = Arc::clone(self);
        tokio::spawn(async move {
            let mut outbound = outbound;
            let agent_ended = receive_from_agent(&client, id, &mut replies, to_caller, &window).await;
            let caller_ended = if agent_ended {
                // The caller may still be sending: its acknowledgements keep coming until its side ends too.
                loop {
                    tokio::select! {
                        ended = &mut outbound => break ended.unwrap_or(false),
                        reply = replies.recv() => match reply {
                            Some(Message::PortAck { bytes }) => add_credit(&window, bytes),
                            _ => {
                                window.close();
                                break (&mut outbound).await.unwrap_or(false);
                            }
                        },
                    }
                }
            } else {
                window.close();
                outbound.abort();
                false
            };
            if !(agent_ended && caller_ended) {
                // The stream broke (or the caller went away) before both sides ended: the agent drops it.
                let _ = client.send(id, Message::PortClose).await;
            }
            client.finish(id);
        });
        Ok(caller)
    }
}

/// Carries the agent's `PortData` to the caller, acknowledging what the caller took; `true` at the agent's
/// `PortEof` (the caller's write side is then shut down), `false` when the stream broke first (the agent's
/// `Failed`, the caller gone, the sandbox gone).
async fn receive_from_agent(
    client: &AgentClient,
    id: u64,
    replies: &mut mpsc::UnboundedReceiver<Message>,
    mut to_caller: WriteHalf<DuplexStream>,
    window: &Semaphore,
) -> bool {
    loop {
        match replies.recv().await {
            Some(Message::PortData { data }) => {
                let Ok(bytes) = BASE64.decode(data) else { return false };
                if to_caller.write_all(&bytes).await.is_err() {
                    return false;
                }
                if client.send(id, Message::PortAck { bytes: bytes.len() as u64 }).await.is_err() {
                    return false;
                }
            }
            Some(Message::PortAck { bytes }) => add_credit(window, bytes),
            Some(Message::PortEof) => {
                let _ = to_caller.shutdown().await;
                return true;
            }
            _ => return false,
        }
    }
}

/// The agent passed `bytes` more of the caller's data on: as many more may be sent.
fn add_credit(window: &Semaphore, bytes: u64) {
    window.add_permits(bytes.min(PORT_WINDOW_BYTES) as usize);
}

/// Carries what the caller writes to the agent, within the window; `true` once the caller's side ended and the
/// agent was told (`PortEof`), `false` when the stream broke first.
async fn send_to_agent(
    client: Arc<AgentClient>,
    id: u64,
    mut from_caller: ReadHalf<DuplexStream>,
    window: Arc<Semaphore>,
) -> bool {
    let mut buffer = vec![0u8; MAX_PORT_CHUNK_BYTES];
    loop {
        let n = match from_caller.read(&mut buffer).await {
            Ok(0) => return client.send(id, Message::PortEof).await.is_ok(),
            Ok(n) => n,
            Err(_) => return false,
        };
        // Permits are bytes the agent has room for; they come back with its `PortAck`s.
        match window.acquire_many(n as u32).await {
            Ok(permit) => permit.forget(),
            Err(_) => return false,
        }
        if client.send(id, Message::PortData { data: BASE64.encode(&buffer[..n]) }).await.is_err() {
            return false;
        }
    }
}
