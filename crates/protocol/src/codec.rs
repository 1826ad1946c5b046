//! Framing: encode an envelope into a frame, decode frames from a byte stream incrementally or blocking.

use std::io::{self, Read, Write};

use thiserror::Error;

use crate::message::{Envelope, PROTOCOL_VERSION};

/// Largest payload accepted, in bytes. Bulk data (files, output) travels in many frames, never one huge one.
pub const MAX_FRAME_BYTES: usize = 16 << 20;

const HEADER_BYTES: usize = 4;

/// What can go wrong reading or writing frames.
#[derive(Debug, Error)]
pub enum ProtocolError {
    /// The length prefix announces more than `MAX_FRAME_BYTES`.
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME_BYTES}")]
    FrameTooLarge(usize),
    /// The payload is not a valid envelope.
    #[error("malformed frame: {0}")]
    Malformed(#[from] serde_json::Error),
    /// The peer speaks another protocol version.
    #[error("peer speaks protocol version {0}, this build speaks {PROTOCOL_VERSION}")]
    UnsupportedVersion(u16),
    /// The stream ended in the middle of a frame.
    #[error("stream ended inside a frame")]
    Truncated,
    /// Reading or writing the transport failed.
    #[error("transport: {0}")]
    Io(#[from] io::Error),
}

/// Serialises an envelope into one frame.
pub fn encode(envelope: &Envelope) -> Result<Vec<u8>, ProtocolError> {
    let payload = serde_json::to_vec(envelope)?;
    if payload.len() > MAX_FRAME_BYTES {
        return Err(ProtocolError::FrameTooLarge(payload.len()));
    }
    let mut frame = Vec::with_capacity(HEADER_BYTES + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&payload);
    Ok(frame)
}

fn decode_payload(payload: &[u8]) -> Result<Envelope, ProtocolError> {
    #[derive(serde::Deserialize)]
    struct VersionOnly {
        v: u16,
    }
    let version: VersionOnly = serde_json::from_slice(payload)?;
    if version.v != PROTOCOL_VERSION {
        return Err(ProtocolError::UnsupportedVersion(version.v));
    }
    Ok(serde_json::from_slice(payload)?)
}

/// Incremental decoder for non-blocking transports: push bytes as they arrive, take whole envelopes out.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
}

impl FrameDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        FrameDecoder::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// True when a partial frame is buffered (an end of stream now would cut it).
    pub fn has_partial_frame(&self) -> bool {
        !self.buffer.is_empty()
    }

    /// The next whole envelope, if one is buffered.
    pub fn next_envelope(&mut self) -> Result<Option<Envelope>, ProtocolError> {
        let Some(header) = self.buffer.first_chunk::<HEADER_BYTES>() else {
            return Ok(None);
        };
        let length = u32::from_le_bytes(*header) as usize;
        if length > MAX_FRAME_BYTES {
            return Err(ProtocolError::FrameTooLarge(length));
        }
        if self.buffer.len() < HEADER_BYTES + length {
            return Ok(None);
        }
        let frame: Vec<u8> = self.buffer.drain(..HEADER_BYTES + length).collect();
        decode_payload(&frame[HEADER_BYTES..]).map(Some)
    }
}

/// Writes one frame.
pub fn write_frame(writer: &mut impl Write, envelope: &Envelope) -> Result<(), ProtocolError> {
    writer.write_all(&encode(envelope)?)?;
    Ok(())
}

/// Reads one frame; `Ok(None)` on a clean end of stream before a frame starts.
pub fn read_frame(reader: &mut impl Read) -> Result<Option<Envelope>, ProtocolError> {
    let mut header = [0u8; HEADER_BYTES];
    let mut filled = 0;
    while filled < HEADER_BYTES {
        match reader.read(&mut header[filled..]) {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => return Err(ProtocolError::Truncated),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let length = u32::from_le_bytes(header) as usize;
    if length > MAX_FRAME_BYTES {
        return Err(ProtocolError::FrameTooLarge(length));
    }
    let mut payload = vec![0u8; length];
    reader.read_exact(&mut payload).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => ProtocolError::Truncated,
        _ => ProtocolError::Io(e),
    })?;
    decode_payload(&payload).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;

    fn sample() -> Envelope {
        Envelope::new(7, Message::FilesystemReady { at_ns: 3 })
    }

    #[test]
    fn frames_round_trip_blocking_and_incremental() {
        let frame = encode(&sample()).unwrap_or_default();
        let mut reader = &frame[..];
        assert_eq!(read_frame(&mut reader).ok().flatten(), Some(sample()));
        let mut decoder = FrameDecoder::new();
        for byte in frame.iter().chain(&frame) {
            decoder.push(std::slice::from_ref(byte));
        }
        assert_eq!(decoder.next_envelope().ok().flatten(), Some(sample()));
        assert_eq!(decoder.next_envelope().ok().flatten(), Some(sample()));
        assert_eq!(decoder.next_envelope().ok().flatten(), None);
    }

    #[test]
    fn oversized_frames_are_refused_before_allocation() {
        let mut decoder = FrameDecoder::new();
        decoder.push(&u32::MAX.to_le_bytes());
        assert!(matches!(decoder.next_envelope(), Err(ProtocolError::FrameTooLarge(_))));
        let mut reader = &u32::MAX.to_le_bytes()[..];
        assert!(matches!(read_frame(&mut reader), Err(ProtocolError::FrameTooLarge(_))));
    }

    #[test]
    fn other_versions_and_garbage_are_errors_not_panics() {
        let payload = br#"{"v":99,"id":1,"msg":{"type":"start"}}"#;
        let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(payload);
        assert!(matches!(read_frame(&mut &frame[..]), Err(ProtocolError::UnsupportedVersion(99))));
        for garbage in [&b"\x03\0\0\0abc"[..], b"\x02\0\0\0{}", b"\x05\0\0"] {
            assert!(read_frame(&mut &garbage[..]).is_err());
        }
        assert_eq!(read_frame(&mut &b""[..]).ok().flatten(), None);
    }

    /// xorshift64: deterministic pseudo-random bytes without a dependency.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    fn serve_samples() -> Vec<Vec<u8>> {
        use sandkasten_types::{Failure, FailureKind, StreamKind};
        let messages = [
            Message::Exec {
                spec: sandkasten_types::CommandSpec::default(),
                background: true,
                output_limit: Some(1 << 20),
            },
            Message::Output { stream: StreamKind::Stderr, data: "aGk=".into() },
            Message::FileRead { path: "/workspace/a".into(), offset: 3, len: 9 },
            Message::AsUser {
                user: sandkasten_types::CommandUser::Root,
                request: Box::new(Message::SetMetadata {
                    path: "/tmp/a".into(),
                    metadata: [("k".to_owned(), "v".to_owned())].into(),
                }),
            },
            Message::Failed(Failure::new(FailureKind::NotEmpty, "x")),
            Message::Shutdown,
        ];
        messages.into_iter().map(|msg| encode(&Envelope::new(5, msg)).unwrap_or_default()).collect()
    }

    #[test]
    fn serve_messages_round_trip_with_snake_case_tags() {
        let frame = encode(&Envelope::new(9, Message::StdinClose)).unwrap_or_default();
        assert!(String::from_utf8_lossy(&frame).contains(r#""type":"stdin_close""#));
        for frame in serve_samples() {
            let decoded = read_frame(&mut &frame[..]).ok().flatten();
            assert_eq!(decoded.as_ref().map(|e| e.id), Some(5), "{}", String::from_utf8_lossy(&frame));
        }
        let failed = encode(&Envelope::new(1, serve_samples_failed())).unwrap_or_default();
        let failed = String::from_utf8_lossy(&failed);
        assert!(failed.contains(r#""type":"failed","kind":"permission_denied","message":"""#), "{failed}");
    }

    fn serve_samples_failed() -> Message {
        Message::Failed(sandkasten_types::Failure::new(sandkasten_types::FailureKind::PermissionDenied, ""))
    }

    const JSON_ALPHABET: &[u8] = br#"{}[]":,0123456789.eEtrufalsn\ vidmsgtype"#;

    /// Random bytes, random valid-length frames with random payloads, and valid frames with flipped bytes: the
    /// decoder returns errors or nothing, and never panics.
    #[test]
    fn decoder_never_panics_on_random_bytes() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let samples = serve_samples();
        for round in 0..4000 {
            let mut bytes: Vec<u8> = match round % 3 {
                0 => (0..rng.next() % 64).map(|_| rng.next() as u8).collect(),
                1 => {
                    let len = (rng.next() % 48) as usize;
                    let mut frame = (len as u32).to_le_bytes().to_vec();
                    frame.extend((0..len).map(|_| JSON_ALPHABET[rng.next() as usize % JSON_ALPHABET.len()]));
                    frame
                }
                _ => {
                    let mut frame = samples[round % samples.len()].clone();
                    for _ in 0..1 + rng.next() % 4 {
                        let at = rng.next() as usize % frame.len().max(1);
                        if let Some(byte) = frame.get_mut(at) {
                            *byte ^= 1 << (rng.next() % 8);
                        }
                    }
                    frame
                }
            };
            let _ = read_frame(&mut &bytes[..]);
            let mut decoder = FrameDecoder::new();
            while !bytes.is_empty() {
                let take = (1 + rng.next() as usize % 16).min(bytes.len());
                decoder.push(&bytes[..take]);
                bytes.drain(..take);
                for _ in 0..4 {
                    match decoder.next_envelope() {
                        Ok(Some(_)) | Err(ProtocolError::Malformed(_) | ProtocolError::UnsupportedVersion(_)) => {}
                        Ok(None) | Err(_) => break,
                    }
                }
            }
        }
    }
}
