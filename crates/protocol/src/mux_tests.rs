//! Unit tests of the door mux: a stream's bytes both ways with half-closes, the stream bound, the window and bad
//! frames (a peer breaking the rules loses the stream, the other side holds nothing more), and winding down.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::*;

/// An opener and an acceptor over one channel; every stream the acceptor connects hands its far end to the test.
fn pair(max_streams: usize) -> (Mux<UnixStream>, Mux<UnixStream>, mpsc::Receiver<UnixStream>) {
    let (guest, host) = UnixStream::pair().expect("channel");
    let opener = Mux::new(Box::new(guest.try_clone().expect("clone")), max_streams);
    let acceptor = Mux::new(Box::new(host.try_clone().expect("clone")), max_streams);
    let (far_ends, received) = mpsc::channel();
    let far_ends = Mutex::new(far_ends);
    let connect: Connect<UnixStream> = Arc::new(move |_port| {
        let (near, far) = UnixStream::pair()?;
        lock(&far_ends).send(far).map_err(|_| io::Error::other("test gone"))?;
        Ok(near)
    });
    let run_opener = opener.clone();
    std::thread::spawn(move || run_opener.run(guest, None));
    let run_acceptor = acceptor.clone();
    std::thread::spawn(move || run_acceptor.run(host, Some(connect)));
    (opener, acceptor, received)
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_stream_carries_bytes_both_ways_and_half_closes() {
    let (opener, acceptor, far_ends) = pair(4);
    let (mut client, inside) = UnixStream::pair().expect("pair");
    assert!(opener.open(inside, 3128));
    let mut far = far_ends.recv_timeout(Duration::from_secs(10)).expect("connected");
    // More than a window each way, so acknowledgements must flow.
    let big: Vec<u8> = (0..(PORT_WINDOW_BYTES as usize * 3)).map(|i| i as u8).collect();
    let sent = big.clone();
    let mut writer = client.try_clone().expect("clone");
    let writing = std::thread::spawn(move || {
        writer.write_all(&sent).expect("write");
        writer.shutdown(Shutdown::Write).expect("half-close");
    });
    let mut got = Vec::new();
    far.read_to_end(&mut got).expect("far end reads to the end");
    assert!(got == big, "the acceptor's side got {} bytes, not the {} sent in order", got.len(), big.len());
    writing.join().expect("writer");
    let answer = big.clone();
    let answering = std::thread::spawn(move || {
        far.write_all(&answer).expect("answer");
        far.shutdown(Shutdown::Write).expect("half-close");
        far
    });
    let mut back = Vec::new();
    client.read_to_end(&mut back).expect("client reads to the end");
    assert!(back == big, "the opener's side got {} bytes back", back.len());
    let far = answering.join().expect("answerer");
    drop((client, far));
    wait_until("both sides forget the stream", || opener.alive() == 0 && acceptor.alive() == 0);
}

#[test]
fn streams_past_the_bound_are_refused_and_hold_nothing() {
    // The opener allows more than the acceptor: the acceptor's bound is what counts.
    let (guest, host) = UnixStream::pair().expect("channel");
    let opener = Mux::new(Box::new(guest.try_clone().expect("clone")), 10);
    let acceptor: Mux<UnixStream> = Mux::new(Box::new(host.try_clone().expect("clone")), 2);
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&held);
    let connect: Connect<UnixStream> = Arc::new(move |_| {
        let (near, far) = UnixStream::pair()?;
        lock(&keep).push(far);
        Ok(near)
    });
    let run_opener = opener.clone();
    std::thread::spawn(move || run_opener.run(guest, None));
    let run_acceptor = acceptor.clone();
    std::thread::spawn(move || run_acceptor.run(host, Some(connect)));
    let mut clients = Vec::new();
    for n in 0..6 {
        let (client, inside) = UnixStream::pair().expect("pair");
        // A stream past the acceptor's bound may be refused before the opener has started it (`open` is then
        // false); the two within it are opened.
        let opened = opener.open(inside, 3128);
        assert!(opened || n >= 2, "stream {n} within the bound was not opened");
        clients.push(client);
    }
    wait_until("the refused streams end on the opener's side", || opener.alive() == 2);
    assert_eq!(acceptor.alive(), 2, "the acceptor holds no more than its bound");
    // The acceptor connects on each stream's own thread: wait for both, then make sure no third follows.
    wait_until("the two streams within the bound are connected", || lock(&held).len() >= 2);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(lock(&held).len(), 2, "the acceptor connected no more than its bound");
    // A refused stream's client sees its connection end.
    let mut last = clients.pop().expect("a client");
    last.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    assert_eq!(last.read(&mut [0u8; 8]).expect("end of stream"), 0);
}

/// A raw peer speaking to an acceptor whose connects wait for `release`: what it sends queues in the stream.
fn raw_acceptor() -> (UnixStream, Mux<UnixStream>, mpsc::Sender<()>) {
    let (peer, host) = UnixStream::pair().expect("channel");
    let acceptor: Mux<UnixStream> = Mux::new(Box::new(host.try_clone().expect("clone")), 4);
    let (release, released) = mpsc::channel::<()>();
    let released = Mutex::new(released);
    let connect: Connect<UnixStream> = Arc::new(move |_| {
        let _ = lock(&released).recv_timeout(Duration::from_secs(10));
        let (near, _far) = UnixStream::pair()?;
        Ok(near)
    });
    let run_acceptor = acceptor.clone();
    std::thread::spawn(move || run_acceptor.run(host, Some(connect)));
    (peer, acceptor, release)
}

fn next_from(peer: &mut UnixStream) -> Envelope {
    peer.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    read_frame(peer).expect("a frame").expect("not the end")
}

#[test]
fn a_peer_sending_past_the_window_loses_the_stream() {
    let (mut peer, acceptor, release) = raw_acceptor();
    write_frame(&mut peer, &Envelope::new(5, Message::PortOpen { port: 3128 })).expect("open");
    let chunk = STANDARD.encode(vec![7u8; MAX_PORT_CHUNK_BYTES]);
    for _ in 0..(PORT_WINDOW_BYTES as usize / MAX_PORT_CHUNK_BYTES + 1) {
        write_frame(&mut peer, &Envelope::new(5, Message::PortData { data: chunk.clone() })).expect("data");
    }
    assert_eq!(next_from(&mut peer), Envelope::new(5, Message::PortClose), "the stream is closed");
    release.send(()).expect("release");
    wait_until("the stream is gone", || acceptor.alive() == 0);
}

/// A slow reader (the acceptor's connection is never read, so the inward pump's write blocks with a window of bytes
/// taken from the buffer and not acknowledged): a peer sending past its credit meanwhile loses the stream. Counting
/// only the buffered bytes let it have twice the window in flight.
#[test]
fn a_slow_reader_bounds_what_the_peer_may_have_unacknowledged() {
    let (mut peer, host) = UnixStream::pair().expect("channel");
    let acceptor: Mux<UnixStream> = Mux::new(Box::new(host.try_clone().expect("clone")), 4);
    let unread = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&unread);
    let connect: Connect<UnixStream> = Arc::new(move |_| {
        let (near, far) = UnixStream::pair()?;
        lock(&keep).push(far);
        Ok(near)
    });
    let run_acceptor = acceptor.clone();
    std::thread::spawn(move || run_acceptor.run(host, Some(connect)));
    write_frame(&mut peer, &Envelope::new(9, Message::PortOpen { port: 3128 })).expect("open");
    assert_eq!(next_from(&mut peer), Envelope::new(9, Message::Done), "connected");
    let send = |peer: &mut UnixStream, bytes: usize| {
        let data = STANDARD.encode(vec![1u8; bytes]);
        write_frame(peer, &Envelope::new(9, Message::PortData { data })).expect("data");
    };
    // Within the rules: spend the credit, take it back from acknowledgements, until they stop (the connection's
    // socket buffer is full and the pump's write blocks with bytes it took from the buffer).
    let mut credit = PORT_WINDOW_BYTES as usize;
    peer.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
    loop {
        while credit > 0 {
            let bytes = credit.min(MAX_PORT_CHUNK_BYTES);
            send(&mut peer, bytes);
            credit -= bytes;
        }
        match read_frame(&mut peer) {
            Ok(Some(Envelope { msg: Message::PortAck { bytes }, .. })) => credit += bytes as usize,
            Ok(other) => panic!("unexpected {other:?}"),
            Err(_) => break,
        }
    }
    assert!(!lock(&unread).is_empty(), "connected");
    // No credit is left: one byte more is past the window.
    send(&mut peer, 1);
    peer.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    let mut answer = read_frame(&mut peer);
    // Closing shuts the connection, whose outward pump may report its end first.
    if matches!(&answer, Ok(Some(Envelope { msg: Message::PortEof, .. }))) {
        answer = read_frame(&mut peer);
    }
    assert!(
        matches!(&answer, Ok(Some(envelope)) if *envelope == Envelope::new(9, Message::PortClose)),
        "data past the unacknowledged window must close the stream, got {answer:?}"
    );
    wait_until("the stream is gone", || acceptor.alive() == 0);
}

#[test]
fn bad_base64_and_a_reused_id_close_the_stream() {
    let (mut peer, acceptor, release) = raw_acceptor();
    write_frame(&mut peer, &Envelope::new(1, Message::PortOpen { port: 3128 })).expect("open");
    write_frame(&mut peer, &Envelope::new(1, Message::PortData { data: "%%%".into() })).expect("data");
    assert_eq!(next_from(&mut peer), Envelope::new(1, Message::PortClose));
    write_frame(&mut peer, &Envelope::new(2, Message::PortOpen { port: 3128 })).expect("open");
    write_frame(&mut peer, &Envelope::new(2, Message::PortOpen { port: 3128 })).expect("open again");
    assert_eq!(next_from(&mut peer), Envelope::new(2, Message::PortClose));
    for _ in 0..2 {
        release.send(()).expect("release");
    }
    wait_until("no stream is left", || acceptor.alive() == 0);
}

#[test]
fn the_end_of_the_channel_closes_every_stream() {
    let (opener, acceptor, far_ends) = pair(4);
    let (_client, inside) = UnixStream::pair().expect("pair");
    assert!(opener.open(inside, 3128));
    let mut far = far_ends.recv_timeout(Duration::from_secs(10)).expect("connected");
    acceptor.close_all();
    far.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    assert_eq!(far.read(&mut [0u8; 8]).expect("end"), 0, "the acceptor's connection ends");
    wait_until("both sides forget the stream", || opener.alive() == 0 && acceptor.alive() == 0);
}
