//! The host ↔ agent protocol: versioned, length-prefixed frames carrying JSON messages, the same on every tier's
//! transport (a socketpair for the process tier; a unix socket or vsock for the others).
//!
//! A frame is a 4-byte little-endian payload length followed by the payload, a JSON `Envelope`
//! `{"v": 1, "id": 7, "msg": {"type": "...", ...}}`. Frames larger than `MAX_FRAME_BYTES` are refused before any
//! allocation, unknown versions are refused, and malformed payloads are an error, never a panic.

mod clock;
mod codec;
mod message;
mod mux;
mod plan;
mod serve_types;

pub use clock::monotonic_ns;
pub use codec::{FrameDecoder, MAX_FRAME_BYTES, ProtocolError, encode, read_frame, write_frame};
pub use message::{Envelope, Message, PROTOCOL_VERSION};
pub use mux::{Connect, MAX_DOOR_STREAMS, MAX_HOST_DOOR_STREAMS, Mux, MuxStream};
pub use plan::{AgentPlan, DoorExit, DoorPlan, SeccompPolicy, VmmPlan};
pub use serve_types::{
    MAX_FILE_CHUNK_BYTES, MAX_OUTPUT_CHUNK_BYTES, MAX_PORT_CHUNK_BYTES, MAX_PORT_STREAMS, MAX_WATCH_EVENTS_PER_FRAME,
    PORT_WINDOW_BYTES, RunningCommand,
};
