//! Feeds arbitrary bytes to the incremental `FrameDecoder` (split at a data-chosen point) and to the blocking
//! `read_frame`: errors are fine, panics, hangs and huge allocations are not.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sandkasten_protocol::{FrameDecoder, ProtocolError, encode, read_frame};

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |&b| b as usize).min(data.len());
    let mut decoder = FrameDecoder::new();
    for part in [&data[..split], &data[split..]] {
        decoder.push(part);
        loop {
            match decoder.next_envelope() {
                // A decoded envelope must encode again.
                Ok(Some(envelope)) => assert!(encode(&envelope).is_ok()),
                Err(ProtocolError::Malformed(_) | ProtocolError::UnsupportedVersion(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }
    let mut reader = data;
    while let Ok(Some(_)) = read_frame(&mut reader) {}
});
