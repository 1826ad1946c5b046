//! Commands on a pseudo-terminal (`spec.pty`): the terminal is their stdin/stdout/stderr and controlling terminal,
//! has the size asked for, is resized on request, takes typed input, and ends with the command.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sandkasten_protocol::Message;
use sandkasten_types::{CommandSpec, FailureKind, PtySize};

use super::{TestAgent, shell};

fn on_terminal(script: &str, cols: u16, rows: u16) -> CommandSpec {
    CommandSpec { pty: Some(PtySize { cols, rows }), ..shell(script) }
}

fn exec(spec: CommandSpec, background: bool) -> Message {
    Message::Exec { spec, background, output_limit: None }
}

#[test]
fn a_pty_command_is_a_session_leader_on_a_terminal_of_the_size_asked_for() {
    let mut agent = TestAgent::start();
    let script = "tty; stty size; [ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo all-terminals; \
                  ps -o sid= -p $$ | tr -d ' '; echo $$; echo to-stderr >&2";
    let reply = agent.request(1, exec(on_terminal(script, 100, 30), false));
    assert!(matches!(reply, Message::ExecStarted { .. }), "{reply:?}");
    let finished = agent.collect(1);
    let text = finished.stdout_text();
    let lines: Vec<&str> = text.lines().map(|l| l.trim_end_matches('\r')).collect();
    assert!(lines[0].starts_with("/dev/pts/"), "{text:?}");
    assert_eq!(lines[1], "30 100", "{text:?}");
    assert_eq!(lines[2], "all-terminals", "{text:?}");
    assert_eq!(lines[3], lines[4], "the command is its session's leader: {text:?}");
    assert_eq!(lines[5], "to-stderr", "stderr is the terminal too: {text:?}");
    assert!(finished.stderr.is_empty());
    assert_eq!(finished.exit.exit_code, Some(0));
    agent.shutdown();
}

#[test]
fn typed_input_reaches_the_program_and_a_resize_is_seen() {
    let mut agent = TestAgent::start();
    let script = "read line; echo got-$line; read again; stty size";
    let reply = agent.request(1, exec(on_terminal(script, 80, 24), true));
    assert!(matches!(reply, Message::ExecStarted { .. }), "{reply:?}");
    let input = |data: &str| Message::StdinData { data: STANDARD.encode(data) };
    assert_eq!(agent.request(1, input("hello\n")), Message::Done);
    assert_eq!(agent.request(1, Message::Resize { size: PtySize { cols: 132, rows: 43 } }), Message::Done);
    assert_eq!(agent.request(1, input("\n")), Message::Done);
    let text = agent.collect(1).stdout_text();
    assert!(text.contains("got-hello"), "{text:?}");
    assert!(text.contains("43 132"), "{text:?}");
    agent.shutdown();
}

#[test]
fn closing_a_terminals_input_sends_end_of_file_and_resizing_a_pipe_command_is_refused() {
    let mut agent = TestAgent::start();
    agent.request(1, exec(on_terminal("cat; echo cat-ended", 80, 24), true));
    assert_eq!(agent.request(1, Message::StdinClose), Message::Done);
    let text = agent.collect(1).stdout_text();
    assert!(text.contains("cat-ended"), "{text:?}");

    agent.request(2, exec(shell("sleep 5"), true));
    let reply = agent.request(2, Message::Resize { size: PtySize { cols: 1, rows: 1 } });
    assert!(matches!(&reply, Message::Failed(f) if f.kind == FailureKind::Conflict), "{reply:?}");
    agent.request(2, Message::Signal { signal: 9 });
    agent.collect(2);
    agent.shutdown();
}
