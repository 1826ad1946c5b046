//! `sudo` inside a sandbox. A setuid program cannot raise anything under `no_new_privs`, so this one asks the
//! sandbox's agent instead: it connects to the agent's socket (`/.sandkasten/run/sudo.sock`, inside the sandbox only),
//! sends one request (the target user, `-i`/`-s`/`-E`, its working directory, the command and its environment) with its
//! standard input, output and error attached (`SCM_RIGHTS`), forwards the signals a terminal or a parent sends it,
//! and exits with the command's status (128 + the signal's number when a signal ended it). The agent starts the
//! command through the sandbox's jail exactly as it starts `user="root"` commands: uid 0 of the sandbox's user
//! namespace, no capabilities, the sandbox's seccomp and landlock. Nothing is ever prompted for.
//!
//! The agent's build script compiles this file with bare `rustc` into a static executable (no crates: it must run in
//! any template's root, whatever its C library), so the few system calls std does not offer are declared here.
//! The protocol (both ends): `crates/agent/src/serve/sudo.rs`.

#![allow(unsafe_code)]

use std::ffi::{OsStr, OsString};
use std::io::Write as _;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::process::ExitCode;

/// Where the agent listens.
const SOCKET_PATH: &str = "/.sandkasten/run/sudo.sock";
/// The first field of every request.
const PROTOCOL: &str = "sandkasten-sudo 1";
/// Largest request the agent takes (the command line and the environment).
const MAX_REQUEST: usize = 128 << 10;
/// Signals passed on to the command, as real sudo does.
const FORWARDED: [i32; 6] = [SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2];

const SIGHUP: i32 = 1;
const SIGINT: i32 = 2;
const SIGQUIT: i32 = 3;
const SIGUSR1: i32 = 10;
const SIGUSR2: i32 = 12;
const SIGTERM: i32 = 15;
const AF_UNIX: i32 = 1;
const SOCK_SEQPACKET: i32 = 5;
const SOCK_CLOEXEC: i32 = 0o2_000_000;
const SFD_CLOEXEC: i32 = 0o2_000_000;
const SOL_SOCKET: i32 = 1;
const SCM_RIGHTS: i32 = 1;
const MSG_NOSIGNAL: i32 = 0x4000;
const SIG_BLOCK: i32 = 0;
const POLLIN: i16 = 0x1;
const EINTR: i32 = 4;
const F_GETFD: i32 = 1;
const O_RDWR: i32 = 2;

#[repr(C)]
struct SockaddrUn {
    sun_family: u16,
    sun_path: [u8; 108],
}

#[repr(C)]
struct Iovec {
    base: *const u8,
    len: usize,
}

#[repr(C)]
struct Msghdr {
    name: *const u8,
    namelen: u32,
    iov: *const Iovec,
    iovlen: usize,
    control: *const u8,
    controllen: usize,
    flags: i32,
}

/// `struct cmsghdr` followed by three descriptors, padded as `CMSG_SPACE(3 * sizeof(int))` is.
#[repr(C, align(8))]
struct ThreeFds {
    len: usize,
    level: i32,
    kind: i32,
    fds: [i32; 3],
    _pad: u32,
}

#[repr(C)]
struct PollFd {
    fd: i32,
    events: i16,
    revents: i16,
}

/// `sigset_t` (1024 bits).
#[repr(C)]
struct SigSet([u64; 16]);

unsafe extern "C" {
    fn socket(domain: i32, kind: i32, protocol: i32) -> i32;
    fn connect(fd: i32, address: *const SockaddrUn, length: u32) -> i32;
    fn sendmsg(fd: i32, message: *const Msghdr, flags: i32) -> isize;
    fn send(fd: i32, buffer: *const u8, length: usize, flags: i32) -> isize;
    fn recv(fd: i32, buffer: *mut u8, length: usize, flags: i32) -> isize;
    fn read(fd: i32, buffer: *mut u8, length: usize) -> isize;
    fn sigemptyset(set: *mut SigSet) -> i32;
    fn sigaddset(set: *mut SigSet, signal: i32) -> i32;
    fn sigprocmask(how: i32, set: *const SigSet, old: *mut SigSet) -> i32;
    fn signalfd(fd: i32, set: *const SigSet, flags: i32) -> i32;
    fn poll(fds: *mut PollFd, count: u64, timeout: i32) -> i32;
    fn fcntl(fd: i32, command: i32, ...) -> i32;
    fn open(path: *const i8, flags: i32, ...) -> i32;
    fn dup2(from: i32, to: i32) -> i32;
    fn close(fd: i32) -> i32;
}

/// What the command line asks for.
#[derive(Debug, Default, PartialEq)]
struct Invocation {
    user: Option<String>,
    login: bool,
    shell: bool,
    preserve_env: bool,
    set_home: bool,
    /// `VAR=value` words before the command.
    assignments: Vec<OsString>,
    command: Vec<OsString>,
    /// `-l`, `-v`, `-k`, `-K`, `-V`, `-h`: answered here.
    answer: Option<Answer>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    List,
    Nothing,
    Version,
    Help,
}

const USAGE: &str = "usage: sudo [-EHiknSs] [-u user] [VAR=value] [command [arg ...]]\n";

fn main() -> ExitCode {
    let invocation = match parse(std::env::args_os().skip(1).collect()) {
        Ok(invocation) => invocation,
        Err(message) => {
            let _ = write!(std::io::stderr(), "sudo: {message}\n{USAGE}");
            return ExitCode::from(1);
        }
    };
    match invocation.answer {
        Some(Answer::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(Answer::Version) => {
            println!("Sudo version 1.9 (sandkasten: agent-mediated, the sandbox's root only)");
            return ExitCode::SUCCESS;
        }
        Some(Answer::List) => {
            println!("User may run the following commands in this sandbox:\n    (root, user) NOPASSWD: ALL");
            return ExitCode::SUCCESS;
        }
        Some(Answer::Nothing) if invocation.command.is_empty() => return ExitCode::SUCCESS,
        Some(Answer::Nothing) | None => {}
    }
    if invocation.command.is_empty() && !invocation.login && !invocation.shell {
        let _ = write!(std::io::stderr(), "{USAGE}");
        return ExitCode::from(1);
    }
    match run(&invocation) {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            let _ = writeln!(std::io::stderr(), "sudo: {message}");
            ExitCode::from(1)
        }
    }
}

fn parse(args: Vec<OsString>) -> Result<Invocation, String> {
    let mut invocation = Invocation::default();
    let mut args = args.into_iter().peekable();
    while let Some(arg) = args.next() {
        let bytes = arg.as_bytes();
        if bytes == b"--" {
            break;
        }
        if let Some(long) = bytes.strip_prefix(b"--") {
            let (name, value) = match long.iter().position(|&b| b == b'=') {
                Some(at) => (&long[..at], Some(OsStr::from_bytes(&long[at + 1..]).to_os_string())),
                None => (long, None),
            };
            match name {
                b"user" => {
                    let value = value.or_else(|| args.next()).ok_or("option '--user' requires an argument")?;
                    invocation.user = Some(value.to_string_lossy().into_owned());
                }
                b"login" => invocation.login = true,
                b"shell" => invocation.shell = true,
                b"preserve-env" => invocation.preserve_env = true,
                b"set-home" => invocation.set_home = true,
                b"non-interactive" | b"stdin" => {}
                b"list" => invocation.answer = Some(Answer::List),
                b"validate" | b"reset-timestamp" | b"remove-timestamp" => invocation.answer = Some(Answer::Nothing),
                b"version" => invocation.answer = Some(Answer::Version),
                b"help" => invocation.answer = Some(Answer::Help),
                _ => return Err(format!("unrecognized option '--{}'", String::from_utf8_lossy(name))),
            }
            continue;
        }
        if bytes.len() < 2 || bytes[0] != b'-' {
            invocation.command.push(arg);
            break;
        }
        for (at, flag) in bytes[1..].iter().enumerate() {
            match flag {
                b'u' => {
                    let rest = &bytes[at + 2..];
                    let value = if rest.is_empty() {
                        args.next().ok_or("option requires an argument -- 'u'")?.to_string_lossy().into_owned()
                    } else {
                        String::from_utf8_lossy(rest).into_owned()
                    };
                    invocation.user = Some(value);
                    break;
                }
                b'i' => invocation.login = true,
                b's' => invocation.shell = true,
                b'E' => invocation.preserve_env = true,
                b'H' => invocation.set_home = true,
                b'n' | b'S' | b'A' | b'P' => {}
                b'l' => invocation.answer = Some(Answer::List),
                b'v' | b'k' | b'K' => invocation.answer = Some(Answer::Nothing),
                b'V' => invocation.answer = Some(Answer::Version),
                b'h' => invocation.answer = Some(Answer::Help),
                other => {
                    return Err(format!(
                        "option -{} is not supported in a sandbox (sudo here runs commands as root or user)",
                        char::from(*other)
                    ));
                }
            }
        }
    }
    invocation.command.extend(args);
    // `sudo VAR=value command`: leading assignments set variables for the command.
    while invocation.command.first().is_some_and(|word| is_assignment(word.as_bytes())) {
        invocation.assignments.push(invocation.command.remove(0));
    }
    Ok(invocation)
}

fn is_assignment(word: &[u8]) -> bool {
    match word.iter().position(|&b| b == b'=') {
        Some(at) if at > 0 => word[..at].iter().all(|&b| b == b'_' || b.is_ascii_alphanumeric()),
        _ => false,
    }
}

/// The request's fields, each NUL-terminated: the protocol, then one tagged field per item (`u` user, `l` login,
/// `s` shell, `E` preserve the environment, `H` set HOME, `c` working directory, `a` argument, `v` assignment, `e`
/// the caller's environment).
fn request(invocation: &Invocation) -> Vec<u8> {
    let mut fields: Vec<Vec<u8>> = vec![PROTOCOL.as_bytes().to_vec()];
    let mut field = |tag: u8, value: &[u8]| {
        let mut item = vec![tag];
        item.extend_from_slice(value);
        fields.push(item);
    };
    if let Some(user) = &invocation.user {
        field(b'u', user.as_bytes());
    }
    for (set, tag) in [
        (invocation.login, b'l'),
        (invocation.shell, b's'),
        (invocation.preserve_env, b'E'),
        (invocation.set_home, b'H'),
    ] {
        if set {
            field(tag, b"");
        }
    }
    if let Ok(cwd) = std::env::current_dir() {
        field(b'c', cwd.as_os_str().as_bytes());
    }
    for arg in &invocation.command {
        field(b'a', arg.as_bytes());
    }
    for assignment in &invocation.assignments {
        field(b'v', assignment.as_bytes());
    }
    for (name, value) in std::env::vars_os() {
        let mut pair = name.into_vec();
        pair.push(b'=');
        pair.extend_from_slice(value.as_bytes());
        field(b'e', &pair);
    }
    let mut message = Vec::new();
    for item in fields {
        message.extend(item.into_iter().filter(|&b| b != 0));
        message.push(0);
    }
    message
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// Makes sure 0, 1 and 2 are open (on `/dev/null` where they are not): all three are passed to the command.
fn occupy_standard_descriptors() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only reads the descriptor's flags.
        if unsafe { fcntl(fd, F_GETFD) } >= 0 {
            continue;
        }
        // SAFETY: a NUL-terminated literal path; the new descriptor is the lowest free one, `fd` itself or moved there.
        let null = unsafe { open(c"/dev/null".as_ptr(), O_RDWR) };
        if null >= 0 && null != fd {
            // SAFETY: both descriptors are this process's; the duplicate replaces the closed `fd`.
            unsafe {
                dup2(null, fd);
                close(null);
            }
        }
    }
}

/// Blocks the forwarded signals and returns a descriptor that reports them.
fn signal_descriptor() -> Result<i32, String> {
    let mut set = SigSet([0; 16]);
    // SAFETY: `set` is a valid, owned sigset_t that these calls initialise and read.
    let fd = unsafe {
        sigemptyset(&mut set);
        for signal in FORWARDED {
            sigaddset(&mut set, signal);
        }
        if sigprocmask(SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(format!("blocking signals: {}", errno()));
        }
        signalfd(-1, &set, SFD_CLOEXEC)
    };
    if fd < 0 {
        return Err(format!("signalfd: {}", errno()));
    }
    Ok(fd)
}

fn connect_to_agent() -> Result<i32, String> {
    // SAFETY: plain integers.
    let fd = unsafe { socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(format!("creating a socket: {}", errno()));
    }
    let mut address = SockaddrUn { sun_family: AF_UNIX as u16, sun_path: [0; 108] };
    address.sun_path[..SOCKET_PATH.len()].copy_from_slice(SOCKET_PATH.as_bytes());
    // SAFETY: `address` is a valid sockaddr_un of the given size.
    if unsafe { connect(fd, &address, std::mem::size_of::<SockaddrUn>() as u32) } != 0 {
        let error = errno();
        return Err(if error.kind() == std::io::ErrorKind::NotFound {
            format!("this sandbox's agent offers no sudo ({SOCKET_PATH} is missing)")
        } else {
            format!("connecting to the sandbox's agent at {SOCKET_PATH}: {error}")
        });
    }
    Ok(fd)
}

fn send_request(socket_fd: i32, message: &[u8]) -> Result<(), String> {
    let iov = Iovec { base: message.as_ptr(), len: message.len() };
    let control = ThreeFds {
        len: std::mem::size_of::<usize>() + 2 * std::mem::size_of::<i32>() + 3 * std::mem::size_of::<i32>(),
        level: SOL_SOCKET,
        kind: SCM_RIGHTS,
        fds: [0, 1, 2],
        _pad: 0,
    };
    let header = Msghdr {
        name: std::ptr::null(),
        namelen: 0,
        iov: &iov,
        iovlen: 1,
        control: (&control as *const ThreeFds).cast(),
        controllen: std::mem::size_of::<ThreeFds>(),
        flags: 0,
    };
    // SAFETY: `header` points at `iov`, `message` and `control`, all alive for the call.
    if unsafe { sendmsg(socket_fd, &header, MSG_NOSIGNAL) } < 0 {
        return Err(format!("sending the request to the sandbox's agent: {}", errno()));
    }
    Ok(())
}

/// Sends the request, then forwards signals until the agent says how the command ended.
fn run(invocation: &Invocation) -> Result<u8, String> {
    let message = request(invocation);
    if message.len() > MAX_REQUEST {
        return Err(format!(
            "the command line and environment take {} bytes, more than the {MAX_REQUEST} sudo passes on",
            message.len()
        ));
    }
    occupy_standard_descriptors();
    let signals = signal_descriptor()?;
    let agent = connect_to_agent()?;
    send_request(agent, &message)?;
    let mut fds =
        [PollFd { fd: agent, events: POLLIN, revents: 0 }, PollFd { fd: signals, events: POLLIN, revents: 0 }];
    loop {
        // SAFETY: `fds` is a valid array of two pollfd.
        if unsafe { poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            if errno().raw_os_error() == Some(EINTR) {
                continue;
            }
            return Err(format!("poll: {}", errno()));
        }
        if fds[1].revents & POLLIN != 0 {
            let mut info = [0u8; 128];
            // SAFETY: reads at most 128 bytes (one signalfd_siginfo) into `info`.
            if unsafe { read(signals, info.as_mut_ptr(), info.len()) } == 128 {
                let signal = u32::from_ne_bytes([info[0], info[1], info[2], info[3]]);
                let frame = format!("k{signal}");
                // SAFETY: `frame` is alive for the call. A failed send means the agent already ended the session.
                unsafe { send(agent, frame.as_ptr(), frame.len(), MSG_NOSIGNAL) };
            }
        }
        if fds[0].revents != 0 {
            let mut reply = [0u8; 4096];
            // SAFETY: receives at most `reply.len()` bytes into `reply`.
            let n = unsafe { recv(agent, reply.as_mut_ptr(), reply.len(), 0) };
            if n < 0 && errno().raw_os_error() == Some(EINTR) {
                continue;
            }
            return answer(&reply[..n.max(0) as usize]);
        }
    }
}

/// The agent's one reply: `x` and the exit status, or `!` and why it refused.
fn answer(reply: &[u8]) -> Result<u8, String> {
    match reply.split_first() {
        Some((b'x', code)) => {
            String::from_utf8_lossy(code).parse::<u8>().map_err(|_| "the sandbox's agent sent a bad status".to_owned())
        }
        Some((b'!', why)) => Err(String::from_utf8_lossy(why).into_owned()),
        _ => Err("the sandbox's agent ended the session without a status".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> Invocation {
        match parse(args.iter().map(OsString::from).collect()) {
            Ok(invocation) => invocation,
            Err(message) => panic!("{args:?}: {message}"),
        }
    }

    fn words(items: &[&str]) -> Vec<OsString> {
        items.iter().map(OsString::from).collect()
    }

    #[test]
    fn options_before_the_command_and_none_after_it() {
        let invocation = parsed(&["-u", "user", "-E", "ls", "-la", "-u"]);
        assert_eq!(invocation.user.as_deref(), Some("user"));
        assert!(invocation.preserve_env);
        assert_eq!(invocation.command, words(&["ls", "-la", "-u"]));
    }

    #[test]
    fn bundled_flags_attached_values_and_long_options() {
        let invocation = parsed(&["-Eiuroot"]);
        assert!(invocation.preserve_env && invocation.login);
        assert_eq!(invocation.user.as_deref(), Some("root"));
        let invocation = parsed(&["--user=user", "--login", "--", "-x"]);
        assert_eq!(invocation.user.as_deref(), Some("user"));
        assert!(invocation.login);
        assert_eq!(invocation.command, words(&["-x"]));
    }

    #[test]
    fn leading_assignments_are_variables_not_the_command() {
        let invocation = parsed(&["A=1", "B_2=x=y", "env", "C=3"]);
        assert_eq!(invocation.assignments, words(&["A=1", "B_2=x=y"]));
        assert_eq!(invocation.command, words(&["env", "C=3"]));
        assert!(!is_assignment(b"=x") && !is_assignment(b"a-b=1"));
    }

    #[test]
    fn harmless_questions_are_answered_here_and_unknown_options_refused() {
        assert_eq!(parsed(&["-l"]).answer, Some(Answer::List));
        assert_eq!(parsed(&["-k"]).answer, Some(Answer::Nothing));
        assert_eq!(parsed(&["-nv"]).answer, Some(Answer::Nothing));
        assert!(parse(words(&["-g", "wheel", "id"])).is_err());
        assert!(parse(words(&["--bogus"])).is_err());
        assert!(parse(words(&["-u"])).is_err());
    }

    #[test]
    fn the_request_is_nul_separated_tagged_fields_without_inner_nuls() {
        let message = request(&parsed(&["-u", "root", "-i", "echo", "a b"]));
        let fields: Vec<&[u8]> = message.split(|&b| b == 0).collect();
        assert_eq!(fields[0], PROTOCOL.as_bytes());
        assert!(fields.contains(&&b"uroot"[..]));
        assert!(fields.contains(&&b"l"[..]));
        assert!(fields.contains(&&b"aecho"[..]));
        assert!(fields.contains(&&b"aa b"[..]));
        assert!(fields.iter().any(|f| f.starts_with(b"c/")));
        assert_eq!(message.last(), Some(&0));
    }

    #[test]
    fn replies_become_exit_codes_or_messages() {
        assert_eq!(answer(b"x0"), Ok(0));
        assert_eq!(answer(b"x130"), Ok(130));
        assert_eq!(answer(b"!unknown user: nobody"), Err("unknown user: nobody".to_owned()));
        assert!(answer(b"").is_err());
        assert!(answer(b"x999").is_err());
    }
}
