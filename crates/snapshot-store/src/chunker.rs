//! Content-defined chunking of a byte stream (FastCDC 2020, `fastcdc::v2020`), fed piece by piece so that memory
//! stays at one maximum-size chunk whatever the stream's length.
//!
//! Sizes: min 256 KiB, average 1 MiB, max 4 MiB. A cut depends only on the bytes since the previous cut, so an edit
//! moves at most the boundaries around it and the chunks after re-synchronise: two snapshots of a filesystem that
//! changed a little share all but a few chunks. A 1 MiB average keeps the object count of a 10 GiB snapshot near
//! 10 000 (one request each on S3), gives zstd enough context, and still localises a changed file of a tar to about
//! a megabyte; the 4 MiB maximum bounds memory per chunk, the 256 KiB minimum bounds the count for pathological data.

use bytes::{Bytes, BytesMut};
use fastcdc::v2020::{Normalization, cut, select_masks};

/// Chunk size bounds in bytes (each even, within fastcdc's limits).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkSizes {
    /// No chunk is shorter, except the last of a part.
    pub min: usize,
    /// The size chunks cluster around.
    pub avg: usize,
    /// No chunk is longer; also the most the chunker buffers.
    pub max: usize,
}

impl ChunkSizes {
    /// The sizes every stored snapshot uses (changing them changes every boundary, so dedup with older snapshots).
    pub(crate) const STANDARD: ChunkSizes = ChunkSizes { min: 256 << 10, avg: 1 << 20, max: 4 << 20 };
}

/// Splits a stream into content-defined chunks: [`Chunker::push`] the stream's pieces, take chunks with
/// [`Chunker::next_chunk`] until it returns `None`, and at the end call `next_chunk(true)` until `None`.
pub(crate) struct Chunker {
    sizes: ChunkSizes,
    mask_small: u64,
    mask_large: u64,
    /// Bytes not yet cut, at most `sizes.max`.
    buffer: BytesMut,
    /// The rest of the last pushed piece, moved into `buffer` as room allows (not copied before then).
    pending: Bytes,
}

impl Chunker {
    pub(crate) fn new(sizes: ChunkSizes) -> Self {
        let (mask_small, mask_large) = select_masks(sizes.avg, Normalization::Level1);
        Chunker { sizes, mask_small, mask_large, buffer: BytesMut::with_capacity(sizes.max), pending: Bytes::new() }
    }

    /// Hands the chunker the stream's next piece. Call only after [`Chunker::next_chunk`] returned `None`.
    pub(crate) fn push(&mut self, piece: Bytes) {
        debug_assert!(self.pending.is_empty());
        self.pending = piece;
    }

    /// The next chunk, once the buffer holds a maximum-size window (so the cut cannot change with more input) or, at
    /// the stream's end, whatever is left.
    pub(crate) fn next_chunk(&mut self, at_end: bool) -> Option<Bytes> {
        let room = self.sizes.max - self.buffer.len();
        let moved = room.min(self.pending.len());
        self.buffer.extend_from_slice(&self.pending.split_to(moved));
        if self.buffer.is_empty() || (self.buffer.len() < self.sizes.max && !at_end) {
            return None;
        }
        let (_, length) = cut(
            &self.buffer,
            self.sizes.min,
            self.sizes.avg,
            self.sizes.max,
            self.mask_small,
            self.mask_large,
            self.mask_small << 1,
            self.mask_large << 1,
        );
        Some(self.buffer.split_to(length.max(1).min(self.buffer.len())).freeze())
    }
}

/// Every chunk of `data` fed in pieces of `piece` bytes (tests and benchmarks).
#[cfg(test)]
pub(crate) fn chunks_of(data: &[u8], piece: usize, sizes: ChunkSizes) -> Vec<Bytes> {
    let mut chunker = Chunker::new(sizes);
    let mut chunks = Vec::new();
    for piece in data.chunks(piece.max(1)) {
        chunker.push(Bytes::copy_from_slice(piece));
        while let Some(chunk) = chunker.next_chunk(false) {
            chunks.push(chunk);
        }
    }
    while let Some(chunk) = chunker.next_chunk(true) {
        chunks.push(chunk);
    }
    chunks
}

/// Deterministic incompressible bytes (BLAKE3's extendable output), like a filesystem of binaries.
#[cfg(test)]
pub(crate) fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    blake3::Hasher::new().update(&seed.to_le_bytes()).finalize_xof().fill(&mut bytes);
    bytes
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashSet;

    use super::*;

    const SIZES: ChunkSizes = ChunkSizes::STANDARD;

    #[test]
    fn chunks_concatenate_to_the_input_and_respect_the_bounds() {
        let data = noise(12 << 20, 1);
        let chunks = chunks_of(&data, 100_000, SIZES);
        assert_eq!(chunks.concat(), data);
        assert!(chunks.len() >= 4, "12 MiB gave only {} chunks", chunks.len());
        let (last, whole) = chunks.split_last().unwrap();
        for chunk in whole {
            assert!((SIZES.min..=SIZES.max).contains(&chunk.len()), "chunk of {} bytes", chunk.len());
        }
        assert!(last.len() <= SIZES.max);
    }

    #[test]
    fn boundaries_do_not_depend_on_how_the_stream_is_cut_into_pieces() {
        let data = noise(9 << 20, 2);
        let one_piece = chunks_of(&data, data.len(), SIZES);
        for piece in [1 << 10, 65_536, 1 << 20, 5 << 20] {
            assert_eq!(chunks_of(&data, piece, SIZES), one_piece, "pieces of {piece}");
        }
    }

    #[test]
    fn inserting_bytes_at_the_front_changes_only_the_first_chunks() {
        let data = noise(16 << 20, 3);
        let mut edited = b"a few new bytes at the front of the stream".to_vec();
        edited.extend_from_slice(&data);
        let before: HashSet<Bytes> = chunks_of(&data, 1 << 16, SIZES).into_iter().collect();
        let after = chunks_of(&edited, 1 << 16, SIZES);
        let new = after.iter().filter(|chunk| !before.contains(*chunk)).count();
        assert!(new <= 2, "{new} of {} chunks changed after an insert at the front", after.len());
        assert!(after.len() >= 8);
    }

    #[test]
    fn empty_and_tiny_inputs() {
        assert!(chunks_of(&[], 10, SIZES).is_empty());
        assert_eq!(chunks_of(b"x", 10, SIZES), vec![Bytes::from_static(b"x")]);
    }

    #[test]
    fn zeroes_are_cut_at_the_maximum() {
        let chunks = chunks_of(&vec![0u8; 10 << 20], 1 << 20, SIZES);
        assert_eq!(chunks.iter().map(Bytes::len).collect::<Vec<_>>(), vec![4 << 20, 4 << 20, 2 << 20]);
    }
}
