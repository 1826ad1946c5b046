//! Commands in serve mode: streaming output, stdin, background + signals, timeouts, floods, daemons holding pipes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sandkasten_protocol::Message;
use sandkasten_types::{CommandSpec, FailureKind};

use super::{TestAgent, eventually, process_gone, shell};

fn exec(spec: CommandSpec, background: bool) -> Message {
    Message::Exec { spec, background, output_limit: None }
}

fn failure_kind(msg: &Message) -> Option<FailureKind> {
    match msg {
        Message::Failed(failure) => Some(failure.kind),
        _ => None,
    }
}

#[test]
fn exec_streams_both_streams_and_reports_the_exit_code() {
    let mut agent = TestAgent::start();
    let reply = agent.request(1, exec(shell("echo out; echo err >&2; exit 3"), false));
    assert!(matches!(reply, Message::ExecStarted { pid } if pid > 0), "{reply:?}");
    let finished = agent.collect(1);
    assert_eq!(finished.stdout_text(), "out\n");
    assert_eq!(finished.stderr, b"err\n");
    assert_eq!((finished.exit.exit_code, finished.exit.signal, finished.exit.timed_out), (Some(3), None, false));
    agent.shutdown();
}

#[test]
fn environment_is_base_plus_command_and_cwd_defaults_to_workspace() {
    let mut agent = TestAgent::start();
    std::fs::create_dir(agent.host_path("/workspace/sub")).unwrap();
    let mut spec = shell("echo \"$LANG $FOO\"; pwd");
    spec.env.insert("FOO".into(), "bar".into());
    agent.request(1, exec(spec, false));
    let text = agent.collect(1).stdout_text();
    assert!(text.starts_with("C.UTF-8 bar\n") && text.trim_end().ends_with("/workspace"), "{text}");
    let mut spec = shell("pwd");
    spec.cwd = Some("/workspace/sub".into());
    agent.request(2, exec(spec, false));
    assert!(agent.collect(2).stdout_text().trim_end().ends_with("/workspace/sub"));
    agent.shutdown();
}

#[test]
fn missing_cwd_and_missing_program_are_exec_failed() {
    let mut agent = TestAgent::start();
    let mut spec = shell("true");
    spec.cwd = Some("/nowhere".into());
    let reply = agent.request(1, exec(spec, false));
    assert_eq!(failure_kind(&reply), Some(FailureKind::ExecFailed));
    assert!(matches!(&reply, Message::Failed(failure) if failure.message.contains("/nowhere does not exist")));
    let spec = CommandSpec { argv: Some(vec!["no-such-program-here".into()]), ..Default::default() };
    assert_eq!(failure_kind(&agent.request(2, exec(spec, false))), Some(FailureKind::ExecFailed));
    let both = CommandSpec { argv: Some(vec!["ls".into()]), cmd: Some("ls".into()), ..Default::default() };
    assert_eq!(failure_kind(&agent.request(3, exec(both, false))), Some(FailureKind::ExecFailed));
    // The agent is still serving.
    agent.request(4, exec(shell("echo alive"), false));
    assert_eq!(agent.collect(4).stdout_text(), "alive\n");
    agent.shutdown();
}

#[test]
fn foreground_stdin_is_written_then_closed() {
    let mut agent = TestAgent::start();
    let spec = CommandSpec { argv: Some(vec!["cat".into()]), stdin: Some("hello\n".into()), ..Default::default() };
    agent.request(1, exec(spec, false));
    let finished = agent.collect(1);
    assert_eq!((finished.stdout_text().as_str(), finished.exit.exit_code), ("hello\n", Some(0)));
    // Without stdin a foreground command reads end-of-file at once.
    agent.request(2, exec(CommandSpec { argv: Some(vec!["cat".into()]), ..Default::default() }, false));
    assert_eq!(agent.collect(2).exit.exit_code, Some(0));
    agent.shutdown();
}

#[test]
fn background_stdin_streams_until_closed() {
    let mut agent = TestAgent::start();
    let spec = CommandSpec { argv: Some(vec!["cat".into()]), stdin: Some("first ".into()), ..Default::default() };
    assert!(matches!(agent.request(5, exec(spec, true)), Message::ExecStarted { .. }));
    let data = STANDARD.encode("second");
    assert_eq!(agent.request(5, Message::StdinData { data }), Message::Done);
    assert_eq!(agent.request(5, Message::StdinClose), Message::Done);
    let finished = agent.collect(5);
    assert_eq!((finished.stdout_text().as_str(), finished.exit.exit_code), ("first second", Some(0)));
    let reply = agent.request(5, Message::StdinData { data: STANDARD.encode("late") });
    assert_eq!(failure_kind(&reply), Some(FailureKind::NotFound));
    agent.shutdown();
}

#[test]
fn a_full_stdin_buffer_is_its_own_failure() {
    let mut agent = TestAgent::start();
    // A program that never reads its stdin: past the pipe, the agent buffers up to MAX_STDIN_BUFFER, then refuses.
    let spec = CommandSpec { argv: Some(vec!["sleep".into(), "30".into()]), ..Default::default() };
    assert!(matches!(agent.request(6, exec(spec, true)), Message::ExecStarted { .. }));
    let megabyte = STANDARD.encode(vec![b'x'; 1 << 20]);
    let limit = crate::serve::MAX_STDIN_BUFFER >> 20;
    let refused =
        (0..limit + 4).find_map(|sent| match agent.request(6, Message::StdinData { data: megabyte.clone() }) {
            Message::Done => None,
            other => Some((sent, other)),
        });
    let Some((sent, Message::Failed(failure))) = refused else { panic!("never refused: {refused:?}") };
    assert_eq!(failure.kind, FailureKind::StdinFull, "{failure:?}");
    assert!(sent >= limit, "refused after {sent} MiB, before the buffer was full");
    assert!(failure.message.contains("send it later"), "{}", failure.message);
    assert_eq!(agent.request(6, Message::Signal { signal: 9 }), Message::Done);
    agent.collect(6);
    agent.shutdown();
}

#[test]
fn signal_reaches_the_command_and_list_shows_it_running() {
    let mut agent = TestAgent::start();
    agent.request(7, exec(CommandSpec { argv: Some(vec!["sleep".into(), "30".into()]), ..Default::default() }, true));
    match agent.request(8, Message::ListCommands) {
        Message::Commands { running } => {
            assert_eq!(running.len(), 1);
            assert_eq!((running[0].id, running[0].argv.clone()), (7, vec!["sleep".to_owned(), "30".to_owned()]));
        }
        other => panic!("{other:?}"),
    }
    let started = Instant::now();
    assert_eq!(agent.request(7, Message::Signal { signal: libc::SIGTERM }), Message::Done);
    let finished = agent.collect(7);
    assert_eq!((finished.exit.signal, finished.exit.timed_out), (Some(libc::SIGTERM), false));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(failure_kind(&agent.request(7, Message::Signal { signal: 15 })), Some(FailureKind::NotFound));
    assert_eq!(agent.request(9, Message::ListCommands), Message::Commands { running: vec![] });
    agent.shutdown();
}

#[test]
fn timeout_kills_the_whole_process_group() {
    let mut agent = TestAgent::start();
    let mut spec = shell("sleep 30 & echo $!; sleep 30");
    spec.timeout_ms = Some(300);
    let started = Instant::now();
    agent.request(1, exec(spec, false));
    let finished = agent.collect(1);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!((finished.exit.signal, finished.exit.timed_out), (Some(libc::SIGKILL), true));
    let grandchild: i32 = finished.stdout_text().trim().parse().unwrap();
    assert!(eventually(Duration::from_secs(3), || process_gone(grandchild)), "the background sleep survived");
    agent.shutdown();
}

#[test]
fn one_mib_flood_arrives_complete_and_in_order() {
    let mut agent = TestAgent::start();
    let seq = CommandSpec { argv: Some(vec!["seq".into(), "1".into(), "200000".into()]), ..Default::default() };
    agent.request(1, exec(seq, false));
    let finished = agent.collect(1);
    let expected: String = (1..=200_000).map(|n| format!("{n}\n")).collect();
    assert!(expected.len() > 1 << 20);
    assert_eq!(finished.stdout.len(), expected.len());
    assert!(finished.stdout == expected.as_bytes(), "output differs from seq's");
    assert_eq!(finished.exit.exit_code, Some(0));
    agent.shutdown();
}

#[test]
fn a_stream_past_the_output_limit_is_discarded_and_the_other_goes_on() {
    let mut agent = TestAgent::start();
    let spec = shell("head -c 100M /dev/zero; echo \"head: $?\" >&2");
    agent.request(1, Message::Exec { spec, background: false, output_limit: Some(1000) });
    let finished = agent.collect(1);
    let sent = finished.stdout.len();
    assert!(sent > 1000 && sent <= 1000 + (64 << 10), "{sent} bytes of stdout were sent for a limit of 1000");
    assert_eq!(finished.stderr, b"head: 0\n", "head wrote all it wanted (no SIGPIPE), stderr was still sent");
    assert_eq!(finished.exit.exit_code, Some(0));
    agent.shutdown();
}

#[test]
fn stop_output_discards_the_rest_of_a_stream() {
    let mut agent = TestAgent::start();
    let spec = shell("echo first; read line; head -c 1M /dev/zero; echo \"head: $?\" >&2");
    assert!(matches!(agent.request(1, exec(spec, true)), Message::ExecStarted { .. }));
    let first = agent.recv_for(1);
    assert!(matches!(&first, Message::Output { data, .. } if data == &STANDARD.encode(b"first\n")), "{first:?}");
    agent.send(1, Message::StopOutput { stream: sandkasten_types::StreamKind::Stdout });
    assert_eq!(agent.request(1, Message::StdinData { data: STANDARD.encode(b"go\n") }), Message::Done);
    let finished = agent.collect(1);
    assert_eq!(finished.stdout, b"", "nothing of stdout after StopOutput");
    assert_eq!(finished.stderr, b"head: 0\n");
    agent.shutdown();
}

#[test]
fn endless_flood_is_backpressured_not_buffered() {
    let mut agent = TestAgent::start();
    agent.request(1, exec(CommandSpec { argv: Some(vec!["yes".into()]), ..Default::default() }, true));
    std::thread::sleep(Duration::from_millis(1500));
    let rss_kib = agent.agent_rss_kib();
    assert!(rss_kib < 96 << 10, "the agent buffered the flood: {rss_kib} KiB resident");
    agent.send(1, Message::Signal { signal: libc::SIGKILL });
    let (exit, discarded) = agent.discard_until_exit(1);
    assert!(discarded > 1 << 20);
    assert_eq!(exit.signal, Some(libc::SIGKILL));
    agent.shutdown();
}

#[test]
fn daemon_holding_the_pipe_does_not_delay_the_exit_report() {
    let mut agent = TestAgent::start();
    let started = Instant::now();
    agent.request(1, exec(shell("sleep 5 & echo started"), false));
    let finished = agent.collect(1);
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert_eq!((finished.stdout_text().as_str(), finished.exit.exit_code), ("started\n", Some(0)));
    agent.shutdown();
}

#[test]
fn shutdown_kills_running_commands() {
    let mut agent = TestAgent::start();
    agent.request(1, exec(shell("echo $$; exec sleep 30"), true));
    let pid = match agent.recv_for(1) {
        Message::Output { data, .. } => String::from_utf8(STANDARD.decode(data).unwrap()).unwrap(),
        other => panic!("{other:?}"),
    };
    let pid: i32 = pid.trim().parse().unwrap();
    agent.shutdown();
    assert!(eventually(Duration::from_secs(3), || process_gone(pid)));
}

#[test]
fn bad_requests_fail_and_the_agent_goes_on() {
    let mut agent = TestAgent::start();
    agent.request(1, exec(CommandSpec { argv: Some(vec!["sleep".into(), "30".into()]), ..Default::default() }, true));
    let again = agent.request(1, exec(shell("true"), false));
    assert_eq!(failure_kind(&again), Some(FailureKind::AlreadyExists));
    assert_eq!(failure_kind(&agent.request(2, Message::StdinClose)), Some(FailureKind::NotFound));
    assert_eq!(failure_kind(&agent.request(3, Message::Start)), Some(FailureKind::Internal));
    let bad = agent.request(1, Message::StdinData { data: "***".into() });
    assert_eq!(failure_kind(&bad), Some(FailureKind::Internal));
    // A malformed frame is answered with id 0 and skipped.
    use std::io::Write as _;
    let payload = br#"{"v":1,"id":4,"msg":{"type":"no_such_message"}}"#;
    let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(payload);
    agent.channel_mut().write_all(&frame).unwrap();
    assert_eq!(failure_kind(&agent.recv_for(0)), Some(FailureKind::Internal));
    assert!(matches!(agent.request(5, Message::ListCommands), Message::Commands { running } if running.len() == 1));
    agent.shutdown();
}
