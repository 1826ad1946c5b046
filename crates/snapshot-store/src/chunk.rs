//! One chunk: its content address (BLAKE3 of the uncompressed bytes), where it lives in the store
//! (`chunks/<first 2 hex>/<hash>.zst`), and its stored form (zstd level 3), decoded with the hash verified.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use object_store::path::Path;
use serde::{Deserialize, Serialize};

/// zstd level for stored chunks: level 3 (zstd's default) compresses a tar of a filesystem ~3x at several hundred
/// MB/s per core; higher levels cost far more CPU for a few percent.
const ZSTD_LEVEL: i32 = 3;

/// The folder of every chunk in the store.
pub(crate) const CHUNKS_PREFIX: &str = "chunks";

/// The BLAKE3 hash of a chunk's uncompressed bytes, written as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkHash(blake3::Hash);

impl ChunkHash {
    /// The hash of `data`.
    pub fn of(data: &[u8]) -> Self {
        ChunkHash(blake3::hash(data))
    }

    /// Where the chunk is stored: `chunks/<first 2 hex>/<hash>.zst` (256 folders, so no directory of a local store
    /// grows past a few thousand entries for a terabyte of chunks).
    pub(crate) fn path(&self) -> Path {
        let hex = self.0.to_hex();
        Path::from(format!("{CHUNKS_PREFIX}/{}/{}.zst", &hex[..2], hex))
    }

    /// The hash a chunk's store path names, or `None` for anything else under `chunks/`.
    pub(crate) fn from_path(path: &Path) -> Option<Self> {
        let mut parts = path.parts();
        if parts.next()?.as_ref() != CHUNKS_PREFIX {
            return None;
        }
        let folder = parts.next()?;
        let file = parts.next()?;
        if parts.next().is_some() {
            return None;
        }
        let hash: ChunkHash = file.as_ref().strip_suffix(".zst")?.parse().ok()?;
        (hash.0.to_hex()[..2] == *folder.as_ref()).then_some(hash)
    }
}

impl fmt::Display for ChunkHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.to_hex().as_str())
    }
}

impl fmt::Debug for ChunkHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkHash({self})")
    }
}

/// A string that is not 64 lowercase hex digits.
#[derive(Debug, thiserror::Error)]
#[error("a chunk hash is 64 lowercase hex digits")]
pub struct InvalidChunkHash;

impl FromStr for ChunkHash {
    type Err = InvalidChunkHash;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        // blake3 also takes uppercase; a store path must have exactly one spelling.
        if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(InvalidChunkHash);
        }
        blake3::Hash::from_hex(text).map(ChunkHash).map_err(|_| InvalidChunkHash)
    }
}

impl Serialize for ChunkHash {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0.to_hex().as_str())
    }
}

impl<'de> Deserialize<'de> for ChunkHash {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A chunk's stored form.
pub(crate) fn compress(data: &[u8]) -> std::io::Result<Vec<u8>> {
    zstd::bulk::compress(data, ZSTD_LEVEL)
}

/// Decompresses a stored chunk and checks that it is `len` bytes hashing to `hash`. The output buffer is `len` bytes
/// at most, so a damaged object cannot make the reader allocate more than the manifest says. The error is the
/// problem, worded to follow "chunk X of part Y …".
pub(crate) fn decode_verified(stored: &[u8], hash: &ChunkHash, len: u64) -> Result<Bytes, String> {
    let capacity =
        usize::try_from(len).map_err(|_| format!("is listed as {len} bytes, more than this host can hold"))?;
    let data = zstd::bulk::decompress(stored, capacity).map_err(|error| format!("does not decompress: {error}"))?;
    if data.len() as u64 != len {
        return Err(format!("decompresses to {} bytes, the manifest says {len}", data.len()));
    }
    let actual = ChunkHash::of(&data);
    if actual != *hash {
        return Err(format!("has the wrong content (its bytes hash to {actual})"));
    }
    Ok(Bytes::from(data))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn path_round_trips_and_uses_the_first_two_hex_digits_as_folder() {
        let hash = ChunkHash::of(b"hello");
        let path = hash.path();
        let hex = hash.to_string();
        assert_eq!(path.as_ref(), format!("chunks/{}/{hex}.zst", &hex[..2]));
        assert_eq!(ChunkHash::from_path(&path), Some(hash));
    }

    #[test]
    fn foreign_paths_are_not_chunks() {
        let hex = ChunkHash::of(b"hello").to_string();
        for path in [
            format!("chunks/00/{hex}.zst"),
            format!("chunks/{}/{hex}", &hex[..2]),
            format!("chunks/{}/{}.zst", &hex[..2], hex.to_uppercase()),
            format!("manifests/{}/{hex}.zst", &hex[..2]),
            format!("chunks/{}/x/{hex}.zst", &hex[..2]),
        ] {
            assert_eq!(ChunkHash::from_path(&Path::from(path.as_str())), None, "{path}");
        }
    }

    #[test]
    fn decode_verified_catches_wrong_bytes_length_and_garbage() {
        let data = vec![7u8; 10_000];
        let hash = ChunkHash::of(&data);
        let stored = compress(&data).unwrap();
        assert_eq!(decode_verified(&stored, &hash, 10_000).unwrap(), data);

        let other = compress(&[8u8; 10_000]).unwrap();
        assert!(decode_verified(&other, &hash, 10_000).unwrap_err().contains("wrong content"));
        assert!(decode_verified(&stored, &hash, 9_999).unwrap_err().contains("does not decompress"));
        assert!(decode_verified(b"garbage", &hash, 10_000).unwrap_err().contains("does not decompress"));
    }
}
