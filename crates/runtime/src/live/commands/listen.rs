//! One listener of a background command: sends the retained output from an offset on, waits for more, and ends with
//! the command's end — or as soon as the receiver is dropped (the client left).

use std::sync::Arc;

use sandkasten_types::CommandEvent;
use tokio::sync::mpsc;

use super::Shared;

/// Runs until the command has ended and everything was sent, or the receiver is gone.
pub(super) async fn listen(shared: Arc<Shared>, mut offset: u64, events: mpsc::Sender<CommandEvent>) {
    let mut changed = shared.log.subscribe();
    loop {
        // Mark the current version seen before reading, so a change after the read wakes the wait below.
        changed.borrow_and_update();
        let read = shared.log.read_from(offset);
        for (chunk, offset) in read.pieces {
            if events.send(CommandEvent::Output { chunk, offset }).await.is_err() {
                return;
            }
        }
        offset = read.next;
        if read.more {
            continue;
        }
        if read.ending.is_some() {
            let _ = events.send(CommandEvent::Ended(shared.status())).await;
            return;
        }
        tokio::select! {
            result = changed.changed() => {
                if result.is_err() {
                    return;
                }
            }
            () = events.closed() => return,
        }
    }
}
