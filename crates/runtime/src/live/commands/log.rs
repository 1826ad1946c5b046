//! The retained output of one background command: both streams in arrival order, each kept up to a byte limit and
//! all of it charged to the sandbox's `OutputBudget` (the first part is kept, what either bound refuses is dropped
//! and the stream marked truncated; the charge is credited back when the log is dropped), cut so that every stored
//! piece ends on a whole UTF-8 character. Positions are byte offsets into the retained output (both streams counted), so a listener
//! can start anywhere and reconnect where it left off. A `watch` channel wakes listeners when something is added.

use std::sync::Mutex;

use sandkasten_types::{CommandExit, OutputChunk, StreamKind};
use tokio::sync::watch;

use crate::retained::{Held, OutputRetention};

/// Largest piece stored: consecutive output of one stream is merged up to this size.
const PIECE_BYTES: usize = 64 << 10;
/// What one stored piece costs besides its bytes (its entry and allocation), charged to the budget with them.
const PIECE_OVERHEAD: u64 = 64;
/// Most pieces one read copies out (a listener starting at 0 does not duplicate the whole log at once).
pub(super) const READ_PIECES: usize = 16;

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ending {
    /// Its exit status; `None` when the sandbox went away before the exit was known.
    pub exit: Option<CommandExit>,
    /// When, ms since the Unix epoch.
    pub ended_ms: i64,
}

#[derive(Debug, Default)]
struct StreamState {
    accepted: u64,
    truncated: bool,
    carry: Vec<u8>,
}

#[derive(Debug)]
struct State {
    pieces: Vec<(StreamKind, u64, Vec<u8>)>,
    total: u64,
    streams: [StreamState; 2],
    ending: Option<Ending>,
    held: Held,
}

/// What a listener reads at once.
#[derive(Debug, Default)]
pub struct Read {
    /// Output after the requested offset, each piece with the offset just after it (what a listener passes to
    /// continue after it).
    pub pieces: Vec<(OutputChunk, u64)>,
    /// Set once the command ended and all output has been read.
    pub ending: Option<Ending>,
    /// More is retained than this read copied out (`READ_PIECES`): read again from `next`.
    pub more: bool,
    /// The offset after everything read.
    pub next: u64,
}

/// One command's retained output.
#[derive(Debug)]
pub struct OutputLog {
    limit: u64,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

fn index(stream: StreamKind) -> usize {
    match stream {
        StreamKind::Stdout => 0,
        StreamKind::Stderr => 1,
    }
}

impl State {
    /// Whether `len` more bytes of `stream` go into the last piece (no new piece).
    fn extends_last_piece(&self, stream: StreamKind, len: usize) -> bool {
        matches!(self.pieces.last(), Some((last, _, bytes)) if *last == stream && bytes.len() + len <= PIECE_BYTES)
    }

    fn store(&mut self, stream: StreamKind, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        match self.pieces.last_mut() {
            Some((last, _, bytes)) if *last == stream && bytes.len() + data.len() <= PIECE_BYTES => {
                bytes.extend_from_slice(data);
            }
            _ => {
                // The piece before is complete: give back what its growth reserved beyond its bytes.
                if let Some((_, _, bytes)) = self.pieces.last_mut() {
                    bytes.shrink_to_fit();
                }
                self.pieces.push((stream, self.total, data.to_vec()));
            }
        }
        self.total += data.len() as u64;
    }
}

impl OutputLog {
    /// An empty log keeping up to `retention.per_stream` bytes per stream, charged to `retention.budget`.
    pub fn new(retention: OutputRetention) -> OutputLog {
        let state = State {
            pieces: Vec::new(),
            total: 0,
            streams: Default::default(),
            ending: None,
            held: Held::new(retention.budget),
        };
        OutputLog { limit: retention.per_stream, state: Mutex::new(state), changed: watch::channel(0).0 }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> Option<T> {
        self.state.lock().ok().map(|mut state| f(&mut state))
    }

    fn notify(&self) {
        self.changed.send_modify(|version| *version = version.wrapping_add(1));
    }

    /// Adds output of `stream` (what fits under the limit and the budget; a trailing partial character waits for the
    /// next chunk). True when this push is the one that cut the stream (nothing more of it will be kept).
    pub fn push(&self, stream: StreamKind, data: &[u8]) -> bool {
        let limit = self.limit;
        let cut = self.with(|state| {
            let own = &mut state.streams[index(stream)];
            if own.truncated {
                // Cut already: what is kept stays a prefix of the stream, never one with holes.
                return false;
            }
            let room = limit.saturating_sub(own.accepted);
            let fits = data.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            let carried = own.carry.len();
            // A new piece costs its bookkeeping too (many tiny alternating writes must not hold far more memory
            // than the budget counts); it is charged first.
            let overhead = if state.extends_last_piece(stream, carried + fits) { 0 } else { PIECE_OVERHEAD };
            let granted = state.held.take(fits as u64 + overhead);
            let take = usize::try_from(granted.saturating_sub(overhead)).unwrap_or(fits).min(fits);
            let own = &mut state.streams[index(stream)];
            let cut = take < data.len();
            if take < data.len() {
                own.truncated = true;
            }
            own.accepted += take as u64;
            let mut pending = std::mem::take(&mut own.carry);
            pending.extend_from_slice(&data[..take]);
            let complete = pending.len() - sandkasten_types::utf8::incomplete_tail_len(&pending);
            own.carry = pending.split_off(complete);
            state.store(stream, &pending);
            cut
        });
        self.notify();
        cut.unwrap_or(false)
    }

    /// Marks the command ended (held-back partial characters are stored as they are). Only the first call counts.
    pub fn finish(&self, ending: Ending) {
        self.with(|state| {
            if state.ending.is_some() {
                return;
            }
            for stream in [StreamKind::Stdout, StreamKind::Stderr] {
                let own = &mut state.streams[index(stream)];
                let carry = std::mem::take(&mut own.carry);
                // A partial character of a cut stream is where the cut fell: dropped. Of a whole stream it is
                // what the program wrote, kept as it is.
                if !own.truncated {
                    state.store(stream, &carry);
                }
            }
            state.ending = Some(ending);
        });
        self.notify();
    }

    /// How the command ended, once it has.
    pub fn ending(&self) -> Option<Ending> {
        self.with(|state| state.ending).flatten()
    }

    /// Whether (stdout, stderr) went past the limit.
    pub fn truncated(&self) -> (bool, bool) {
        self.with(|state| (state.streams[0].truncated, state.streams[1].truncated)).unwrap_or_default()
    }

    /// What is retained after `offset`, at most `READ_PIECES` pieces (a piece that `offset` falls into is cut there).
    pub fn read_from(&self, offset: u64) -> Read {
        self.with(|state| {
            let mut read = Read { next: offset.max(state.total), ..Read::default() };
            let first = state.pieces.partition_point(|(_, start, data)| start + data.len() as u64 <= offset);
            let pending = &state.pieces[first..];
            for (stream, start, data) in pending.iter().take(READ_PIECES) {
                let end = start + data.len() as u64;
                let skip = usize::try_from(offset.saturating_sub(*start)).unwrap_or(usize::MAX).min(data.len());
                read.pieces.push((OutputChunk { stream: *stream, data: data[skip..].to_vec() }, end));
            }
            read.more = pending.len() > READ_PIECES;
            if let (true, Some((_, end))) = (read.more, read.pieces.last()) {
                read.next = *end;
            }
            read.ending = if read.more { None } else { state.ending };
            read
        })
        .unwrap_or_default()
    }

    /// A receiver that changes whenever output is added or the command ends.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use crate::retained::OutputBudget;

    const OUT: StreamKind = StreamKind::Stdout;
    const ERR: StreamKind = StreamKind::Stderr;

    fn log(per_stream: u64) -> OutputLog {
        OutputLog::new(OutputRetention { per_stream, budget: OutputBudget::new(u64::MAX, None) })
    }

    fn texts(read: &Read) -> Vec<(StreamKind, String, u64)> {
        read.pieces.iter().map(|(c, end)| (c.stream, String::from_utf8_lossy(&c.data).into_owned(), *end)).collect()
    }

    #[test]
    fn pieces_merge_per_stream_and_can_be_read_from_any_offset() {
        let log = log(100);
        log.push(OUT, b"ab");
        log.push(OUT, b"cd");
        log.push(ERR, b"E");
        log.push(OUT, b"f");
        assert_eq!(texts(&log.read_from(0)), [(OUT, "abcd".into(), 4), (ERR, "E".into(), 5), (OUT, "f".into(), 6)]);
        assert_eq!(texts(&log.read_from(3)), [(OUT, "d".into(), 4), (ERR, "E".into(), 5), (OUT, "f".into(), 6)]);
        let done = log.read_from(6);
        assert!(done.pieces.is_empty() && done.ending.is_none());
        assert_eq!(done.next, 6);
    }

    #[test]
    fn each_stream_keeps_its_first_part_up_to_the_limit() {
        let log = log(4);
        assert!(log.push(OUT, b"123456"), "this push cut stdout");
        assert!(!log.push(ERR, b"ab"));
        assert!(!log.push(OUT, b"7"), "cut already");
        assert_eq!(texts(&log.read_from(0)), [(OUT, "1234".into(), 4), (ERR, "ab".into(), 6)]);
        assert_eq!(log.truncated(), (true, false));
    }

    #[test]
    fn a_split_character_is_stored_whole_and_the_ending_is_kept() {
        let euro = "€".as_bytes();
        let log = log(100);
        log.push(OUT, &[b'a', euro[0]]);
        assert_eq!(texts(&log.read_from(0)), [(OUT, "a".into(), 1)]);
        log.push(OUT, &euro[1..]);
        log.push(ERR, &[0xE2]);
        log.finish(Ending { exit: None, ended_ms: 5 });
        log.finish(Ending { exit: Some(CommandExit::default()), ended_ms: 6 });
        let read = log.read_from(1);
        assert_eq!(read.pieces[0].0.data, euro);
        assert_eq!(read.pieces[1].0.data, [0xE2]);
        assert_eq!(read.ending, Some(Ending { exit: None, ended_ms: 5 }));
    }

    #[test]
    fn the_sandbox_budget_bounds_every_log_together_and_is_credited_when_one_is_dropped() {
        // Room for two pieces' bookkeeping and 10 bytes.
        let budget = OutputBudget::new(2 * PIECE_OVERHEAD + 10, None);
        let retention = OutputRetention { per_stream: 100, budget: Arc::clone(&budget) };
        let (first, second) = (OutputLog::new(retention.clone()), OutputLog::new(retention.clone()));
        first.push(OUT, b"12345678");
        second.push(ERR, b"abcdef");
        assert_eq!(texts(&second.read_from(0)), [(ERR, "ab".into(), 2)]);
        assert_eq!(second.truncated(), (false, true));
        assert_eq!(budget.used(), budget.limit());
        drop(first);
        assert_eq!(budget.used(), PIECE_OVERHEAD + 2);
        second.push(ERR, b"cd");
        assert_eq!(budget.used(), PIECE_OVERHEAD + 2, "a cut stream keeps a prefix: nothing after the cut");
        let third = OutputLog::new(retention);
        third.push(OUT, b"cd");
        assert_eq!(third.truncated(), (false, false), "the freed room is there for others");
    }

    #[test]
    fn tiny_alternating_writes_pay_for_their_pieces() {
        let budget = OutputBudget::new(100 * PIECE_OVERHEAD, None);
        let log = OutputLog::new(OutputRetention { per_stream: u64::MAX, budget: Arc::clone(&budget) });
        for n in 0..10_000 {
            log.push(if n % 2 == 0 { OUT } else { ERR }, b"x");
        }
        let pieces = log.with(|state| state.pieces.len()).unwrap_or_default();
        assert!(pieces < 100, "{pieces} pieces kept under a budget for 100 pieces' bookkeeping");
        assert!(budget.used() <= budget.limit());
    }

    #[test]
    fn a_long_log_is_read_in_bounded_parts() {
        let log = log(u64::MAX);
        for n in 0..(READ_PIECES + 3) {
            log.push(if n % 2 == 0 { OUT } else { ERR }, b"x");
        }
        log.finish(Ending { exit: None, ended_ms: 1 });
        let first = log.read_from(0);
        assert_eq!((first.pieces.len(), first.more, first.ending.is_some()), (READ_PIECES, true, false));
        let rest = log.read_from(first.next);
        assert_eq!((rest.pieces.len(), rest.more, rest.ending.is_some()), (3, false, true));
        assert_eq!(rest.next, (READ_PIECES + 3) as u64);
    }
}
