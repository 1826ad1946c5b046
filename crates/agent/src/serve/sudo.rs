//! `sudo` inside the sandbox, served by the agent. A setuid program cannot raise anything under `no_new_privs`, so
//! the sandbox's `sudo` (`crates/sudo`, embedded here and installed at `CLIENT_PATH`) asks the agent: it connects to
//! `SOCKET_PATH` and sends one request with its standard streams attached; the agent starts the command through the
//! same launcher as every command (`as_root`: uid 0 of the sandbox's user namespace, no capabilities, the sandbox's
//! seccomp and landlock), relays the signals the client forwards and answers with the exit status.
//!
//! The socket is in `RUN_DIR`, a tmpfs of the agent's that every tier mounts empty (root's, mode 0755: nobody else
//! can replace the socket; no command may write there, landlock grants no write beneath it). Only the sandbox user
//! and root may use it (the credentials the kernel attaches to the request), at most `MAX_SESSIONS` at once, a request must come within
//! `REQUEST_DEADLINE_NS` of connecting and be at most `MAX_REQUEST` bytes; anything else is refused with a reason and
//! the connection closed, the agent goes on. A session whose client goes away (killed with its command) takes its
//! command's process group with it.
//!
//! Protocol (SOCK_SEQPACKET, one message each): the request is NUL-terminated fields, `PROTOCOL` first, then tagged
//! fields: `u` target user, `l` login shell (`-i`), `s` shell (`-s`), `E` preserve the environment, `H` set HOME,
//! `c` working directory, `a` an argument, `v` a `VAR=value` of the command line, `e` the caller's environment;
//! `SCM_RIGHTS` carries its stdin, stdout and stderr. Then the client may send `k<signal>`; the agent answers once,
//! `x<status>` or `!<why>`.

use std::collections::BTreeMap;
use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendFlags, SocketAddrUnix,
    SocketFlags, SocketType,
};
use rustix::process::{Pid, Signal};
use sandkasten_jail::process::Stdio;

use super::commands::CommandContext;
use super::launcher::LaunchRequest;
use crate::reaper::ExitStatus;

pub use sandkasten_jail::rootfs::AGENT_RUN_DIR as RUN_DIR;
/// Where the agent listens.
pub const SOCKET_PATH: &str = "/.sandkasten/run/sudo.sock";
/// Where the client is installed (its directory ends the sandbox's `PATH`).
pub const CLIENT_PATH: &str = "/.sandkasten/run/bin/sudo";
/// The first field of every request.
pub const PROTOCOL: &[u8] = b"sandkasten-sudo 1";
/// Largest request taken (the client refuses to send more).
pub const MAX_REQUEST: usize = 128 << 10;
/// Most sessions (connected or running) at once.
pub const MAX_SESSIONS: usize = 16;
/// How long a connection may take to send its request.
pub const REQUEST_DEADLINE_NS: u64 = 2_000_000_000;

/// The client, built by `build.rs` from `crates/sudo/src/main.rs`.
static CLIENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sandkasten-sudo"));

/// Signals a client may have passed on to its command.
const FORWARDED: [Signal; 6] = [Signal::HUP, Signal::INT, Signal::QUIT, Signal::TERM, Signal::USR1, Signal::USR2];

/// A connection: waiting for its request, or its command running.
struct Session {
    connection: OwnedFd,
    state: State,
}

#[derive(Clone, Copy)]
enum State {
    Waiting { since_ns: u64 },
    Running { pid: libc::pid_t },
}

/// The listener and its sessions.
pub struct Sudo {
    listener: OwnedFd,
    sessions: BTreeMap<u64, Session>,
    next_id: u64,
}

/// Why `Sudo::open` offers nothing.
#[derive(Debug, thiserror::Error)]
pub enum SudoUnavailable {
    /// The tier mounted no run directory (a plain test root, an older runtime).
    #[error("no {RUN_DIR}")]
    NoRunDirectory,
    /// Installing the client or binding the socket failed.
    #[error("{0}")]
    Setup(String),
}

impl Sudo {
    /// Installs the client and listens, when the sandbox has the run directory.
    pub fn open() -> Result<Sudo, SudoUnavailable> {
        if !std::path::Path::new(RUN_DIR).is_dir() {
            return Err(SudoUnavailable::NoRunDirectory);
        }
        let setup = |what: &str, e: std::io::Error| SudoUnavailable::Setup(format!("{what}: {e}"));
        let bin = format!("{RUN_DIR}/bin");
        std::fs::create_dir_all(&bin).map_err(|e| setup("creating the sudo client's directory", e))?;
        std::fs::write(CLIENT_PATH, CLIENT).map_err(|e| setup("installing the sudo client", e))?;
        std::fs::set_permissions(CLIENT_PATH, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| setup("making the sudo client executable", e))?;
        let _ = std::fs::remove_file(SOCKET_PATH);
        let listener = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(|e| setup("creating the sudo socket", e.into()))?;
        let address = SocketAddrUnix::new(SOCKET_PATH).map_err(|e| setup("the sudo socket's address", e.into()))?;
        rustix::net::bind(&listener, &address).map_err(|e| setup("binding the sudo socket", e.into()))?;
        rustix::net::sockopt::set_socket_passcred(&listener, true)
            .map_err(|e| setup("asking for the callers' credentials", e.into()))?;
        // Anyone in the sandbox may connect; who may use it is decided by the credentials its request carries.
        std::fs::set_permissions(SOCKET_PATH, std::fs::Permissions::from_mode(0o666))
            .map_err(|e| setup("opening the sudo socket to the sandbox", e))?;
        rustix::net::listen(&listener, MAX_SESSIONS as i32).map_err(|e| setup("listening", e.into()))?;
        Ok(Sudo { listener, sessions: BTreeMap::new(), next_id: 0 })
    }

    /// The listener's descriptor (poll for reading).
    pub fn listener(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Every session's connection (poll for reading).
    pub fn connections(&self) -> impl Iterator<Item = (u64, BorrowedFd<'_>)> {
        self.sessions.iter().map(|(&id, session)| (id, session.connection.as_fd()))
    }

    /// When the oldest waiting connection's deadline passes.
    pub fn next_due_ns(&self) -> Option<u64> {
        let waiting = |session: &Session| match session.state {
            State::Waiting { since_ns } => Some(since_ns.saturating_add(REQUEST_DEADLINE_NS)),
            State::Running { .. } => None,
        };
        self.sessions.values().filter_map(waiting).min()
    }

    /// Takes every pending connection: refused at once when too many are open.
    pub fn accept(&mut self, now_ns: u64) {
        while let Ok(connection) =
            rustix::net::accept_with(&self.listener, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK)
        {
            if self.sessions.len() >= MAX_SESSIONS {
                refuse(&connection, &format!("{MAX_SESSIONS} sudo sessions are open already: wait for one to end"));
            } else if let Err(error) = rustix::net::sockopt::set_socket_passcred(&connection, true) {
                refuse(&connection, &format!("asking for the caller's credentials: {error}"));
            } else {
                self.next_id += 1;
                self.sessions.insert(self.next_id, Session { connection, state: State::Waiting { since_ns: now_ns } });
            }
        }
    }

    /// A session's connection is readable: its request, a forwarded signal, or its client gone.
    pub fn ready(&mut self, context: &CommandContext<'_>, id: u64) {
        let Some(session) = self.sessions.get_mut(&id) else { return };
        match session.state {
            State::Waiting { .. } => match receive_request(&session.connection) {
                Ok(None) => {}
                Ok(Some(request)) => match start(context, &request) {
                    Ok(pid) => session.state = State::Running { pid },
                    Err(why) => {
                        refuse(&session.connection, &why);
                        self.sessions.remove(&id);
                    }
                },
                Err(why) => {
                    refuse(&session.connection, &why);
                    self.sessions.remove(&id);
                }
            },
            State::Running { pid } => {
                let mut frame = [0u8; 64];
                match rustix::net::recv(&session.connection, &mut frame, RecvFlags::DONTWAIT) {
                    Err(Errno::AGAIN | Errno::INTR) => {}
                    Ok((n, _)) if n > 0 => forward_signal(pid, &frame[..n.min(frame.len())]),
                    // The client is gone (its command was killed): its command goes with it.
                    Ok(_) | Err(_) => {
                        kill_group(pid, Signal::KILL);
                        self.sessions.remove(&id);
                    }
                }
            }
        }
    }

    /// Closes connections whose request is overdue.
    pub fn expire(&mut self, now_ns: u64) {
        let overdue: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| matches!(s.state, State::Waiting { since_ns } if now_ns >= since_ns + REQUEST_DEADLINE_NS))
            .map(|(&id, _)| id)
            .collect();
        for id in overdue {
            if let Some(session) = self.sessions.remove(&id) {
                refuse(&session.connection, "no request came in time");
            }
        }
    }

    /// Answers the sessions whose command was reaped with its exit status.
    pub fn reaped(&mut self, reaped: &[(libc::pid_t, ExitStatus)]) {
        for (pid, status) in reaped {
            let ended = self.sessions.iter().find(|(_, s)| matches!(s.state, State::Running { pid: p } if p == *pid));
            if let Some((&id, session)) = ended {
                let code = match (status.exit_code, status.signal) {
                    (Some(code), _) => code,
                    (None, Some(signal)) => 128 + signal,
                    (None, None) => 1,
                };
                send(&session.connection, format!("x{}", code.clamp(0, 255)).as_bytes());
                self.sessions.remove(&id);
            }
        }
    }

    /// SIGKILLs every running session's process group (the sandbox is ending).
    pub fn kill_all(&mut self) {
        for session in std::mem::take(&mut self.sessions).into_values() {
            if let State::Running { pid } = session.state {
                kill_group(pid, Signal::KILL);
            }
        }
    }
}

fn send(connection: &OwnedFd, frame: &[u8]) {
    // One small frame into an empty send buffer; a client that is gone gets nothing.
    let _ = rustix::net::send(connection, frame, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
}

fn refuse(connection: &OwnedFd, why: &str) {
    let mut frame = b"!".to_vec();
    frame.extend_from_slice(why.as_bytes());
    send(connection, &frame);
}

fn kill_group(pid: libc::pid_t, signal: Signal) {
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// `k<signal>`: a signal the client received, for its command's process group; anything else is ignored.
fn forward_signal(pid: libc::pid_t, frame: &[u8]) {
    let number = frame.strip_prefix(b"k").and_then(|n| std::str::from_utf8(n).ok()).and_then(|n| n.parse().ok());
    if let Some(signal) = number.and_then(Signal::from_named_raw).filter(|s| FORWARDED.contains(s)) {
        kill_group(pid, signal);
    }
}

/// A request as received: its fields, its three descriptors and the caller's uid (as the kernel attests it: a
/// process cannot claim another's credentials without `CAP_SETUID`, which no process of a sandbox has).
struct Request {
    fields: Vec<Vec<u8>>,
    stdio: [OwnedFd; 3],
    caller_uid: u32,
}

/// The request waiting on `connection`; `None` when nothing has arrived yet. The caller's credentials come with the
/// message (`SO_PASSCRED`), not from `SO_PEERCRED`: gVisor answers `SO_PEERCRED` on an accepted socket with the
/// credentials of its own side.
fn receive_request(connection: &OwnedFd) -> Result<Option<Request>, String> {
    let mut buffer = vec![0u8; MAX_REQUEST];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4), ScmCredentials(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        connection,
        &mut [IoSliceMut::new(&mut buffer)],
        &mut control,
        RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC | RecvFlags::TRUNC,
    );
    let received = match received {
        Ok(received) => received,
        Err(Errno::AGAIN | Errno::INTR) => return Ok(None),
        Err(error) => return Err(format!("receiving the request: {error}")),
    };
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut caller_uid = None;
    for message in control.drain() {
        match message {
            RecvAncillaryMessage::ScmRights(passed) => fds.extend(passed),
            RecvAncillaryMessage::ScmCredentials(credentials) => caller_uid = Some(credentials.uid.as_raw()),
            _ => {}
        }
    }
    if received.bytes == 0 {
        return Err("empty request".to_owned());
    }
    if received.bytes > MAX_REQUEST || received.flags.contains(ReturnFlags::TRUNC) {
        return Err(format!("the request is {} bytes, more than the {MAX_REQUEST} taken", received.bytes));
    }
    if received.flags.contains(ReturnFlags::CTRUNC) {
        return Err("the request passed more than its three standard descriptors".to_owned());
    }
    let caller_uid = caller_uid.ok_or("the request came without the caller's credentials")?;
    let fields = parse_fields(&buffer[..received.bytes])?;
    let stdio: [OwnedFd; 3] =
        fds.try_into().map_err(|fds: Vec<OwnedFd>| format!("the request passed {} descriptors, not 3", fds.len()))?;
    Ok(Some(Request { fields, stdio, caller_uid }))
}

/// Splits the NUL-terminated fields and checks the protocol.
fn parse_fields(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let body = bytes.strip_suffix(b"\0").ok_or("the request is not NUL-terminated fields")?;
    let mut fields = body.split(|&b| b == 0);
    if fields.next() != Some(PROTOCOL) {
        return Err(format!("not a {} request", String::from_utf8_lossy(PROTOCOL)));
    }
    let fields: Vec<Vec<u8>> = fields.map(<[u8]>::to_vec).collect();
    let known =
        |field: &Vec<u8>| matches!(field.first(), Some(b'u' | b'l' | b's' | b'E' | b'H' | b'c' | b'a' | b'v' | b'e'));
    if let Some(bad) = fields.iter().find(|field| !known(field)) {
        return Err(format!("unknown request field {:?}", String::from_utf8_lossy(bad)));
    }
    Ok(fields)
}

/// A user of the sandbox's `/etc/passwd`.
#[derive(Debug, Clone, PartialEq)]
pub struct Account {
    /// Login name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its home.
    pub home: String,
    /// Its login shell.
    pub shell: String,
}

/// The accounts of a passwd file.
pub fn accounts(passwd: &str) -> Vec<Account> {
    let account = |line: &str| {
        let f: Vec<&str> = line.split(':').collect();
        let [name, _, uid, gid, _, home, shell] = f.as_slice() else { return None };
        Some(Account {
            name: (*name).to_owned(),
            uid: uid.parse().ok()?,
            gid: gid.parse().ok()?,
            home: (*home).to_owned(),
            shell: if shell.is_empty() { "/bin/sh".to_owned() } else { (*shell).to_owned() },
        })
    };
    passwd.lines().filter_map(account).collect()
}

/// What one request asks for, decoded.
#[derive(Debug, Default, PartialEq)]
pub struct Ask {
    /// `-u`: a name or `#uid`; root when absent.
    pub user: Option<String>,
    /// `-i`.
    pub login: bool,
    /// `-s`.
    pub shell: bool,
    /// `-E`.
    pub preserve_env: bool,
    /// `-H`.
    pub set_home: bool,
    /// The caller's working directory.
    pub cwd: Option<String>,
    /// The command.
    pub argv: Vec<String>,
    /// `VAR=value` words of the command line.
    pub assignments: Vec<(String, String)>,
    /// The caller's environment.
    pub caller_env: BTreeMap<String, String>,
}

fn pair(bytes: &[u8]) -> Option<(String, String)> {
    let text = String::from_utf8_lossy(bytes);
    let (name, value) = text.split_once('=')?;
    (!name.is_empty()).then(|| (name.to_owned(), value.to_owned()))
}

/// Decodes the fields (after the protocol).
pub fn decode(fields: &[Vec<u8>]) -> Ask {
    let mut ask = Ask::default();
    for (&tag, value) in fields.iter().filter_map(|field| field.split_first()) {
        let text = || String::from_utf8_lossy(value).into_owned();
        match tag {
            b'u' => ask.user = Some(text()),
            b'l' => ask.login = true,
            b's' => ask.shell = true,
            b'E' => ask.preserve_env = true,
            b'H' => ask.set_home = true,
            b'c' => ask.cwd = Some(text()),
            b'a' => ask.argv.push(text()),
            b'v' => ask.assignments.extend(pair(value)),
            _ => ask.caller_env.extend(pair(value)),
        }
    }
    ask
}

/// The target account of `user` (`root` when absent), which must be root or the sandbox user.
pub fn target<'a>(accounts: &'a [Account], user: Option<&str>, sandbox_uid: u32) -> Result<&'a Account, String> {
    let wanted = user.unwrap_or("root");
    let found = match wanted.strip_prefix('#') {
        Some(uid) => uid.parse::<u32>().ok().and_then(|uid| accounts.iter().find(|a| a.uid == uid)),
        None => accounts.iter().find(|a| a.name == wanted),
    };
    match found {
        Some(account) if account.uid == 0 || account.uid == sandbox_uid => Ok(account),
        Some(account) => Err(format!(
            "{} (uid {}) cannot be run as in a sandbox: sudo here runs commands as root or the sandbox user",
            account.name, account.uid
        )),
        None => Err(format!("unknown user {wanted}")),
    }
}

/// Real sudo's quoting of a command for `shell -c`: every character but letters, digits, `_`, `-` and `$` escaped.
pub fn shell_words(argv: &[String]) -> String {
    let escape = |arg: &String| {
        arg.chars().fold(String::new(), |mut out, c| {
            if !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '$')) {
                out.push('\\');
            }
            out.push(c);
            out
        })
    };
    argv.iter().map(escape).collect::<Vec<_>>().join(" ")
}

/// The program and arguments to run: the command, or the target's shell (`-s`: the caller's `SHELL` first; `-i`: a
/// login shell) running it.
pub fn program(ask: &Ask, target: &Account) -> Vec<String> {
    if !ask.login && !ask.shell {
        return ask.argv.clone();
    }
    let shell = match ask.caller_env.get("SHELL") {
        Some(shell) if ask.shell && !ask.login && shell.starts_with('/') => shell.clone(),
        _ => target.shell.clone(),
    };
    let mut argv = vec![shell];
    if ask.login {
        argv.push("-l".to_owned());
    }
    if !ask.argv.is_empty() {
        argv.push("-c".to_owned());
        argv.push(shell_words(&ask.argv));
    }
    argv
}

/// Variables kept from the caller's environment when it is reset (as sudo's `env_reset` keeps them).
fn kept(name: &str) -> bool {
    matches!(name, "TERM" | "COLORTERM" | "LANG" | "LANGUAGE" | "TZ" | "DISPLAY") || name.starts_with("LC_")
}

/// The command's environment: reset as sudo's `env_reset` does (or the caller's with `-E`), `PATH` the sandbox's,
/// the target's identity, the caller's as `SUDO_*`, and the command line's assignments last.
pub fn environment(
    ask: &Ask,
    target: &Account,
    caller: Option<&Account>,
    caller_uid: u32,
    base_env: &BTreeMap<String, String>,
    command: &[String],
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = if ask.preserve_env {
        ask.caller_env.clone()
    } else {
        ask.caller_env.iter().filter(|(name, _)| kept(name)).map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    if let Some(path) = base_env.get("PATH") {
        env.insert("PATH".to_owned(), path.clone());
    }
    if !ask.preserve_env || ask.set_home || ask.login {
        env.insert("HOME".to_owned(), target.home.clone());
    }
    for name in ["USER", "LOGNAME"] {
        env.insert(name.to_owned(), target.name.clone());
    }
    env.insert("SHELL".to_owned(), target.shell.clone());
    env.entry("LANG".to_owned()).or_insert_with(|| "C.UTF-8".to_owned());
    env.insert("SUDO_USER".to_owned(), caller.map_or_else(|| caller_uid.to_string(), |c| c.name.clone()));
    env.insert("SUDO_UID".to_owned(), caller_uid.to_string());
    env.insert("SUDO_GID".to_owned(), caller.map_or(caller_uid, |c| c.gid).to_string());
    env.insert("SUDO_COMMAND".to_owned(), command.join(" "));
    env.extend(ask.assignments.iter().cloned());
    env
}

/// Starts a request's command; its pid, or why not.
fn start(context: &CommandContext<'_>, request: &Request) -> Result<libc::pid_t, String> {
    let Request { fields, stdio, caller_uid } = request;
    let caller_uid = *caller_uid;
    let sandbox_uid = context.root.identity().map_or(0, |identity| identity.uid);
    if caller_uid != 0 && caller_uid != sandbox_uid {
        return Err(format!("uid {caller_uid} may not use sudo in this sandbox"));
    }
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(|e| format!("reading /etc/passwd: {e}"))?;
    let accounts = accounts(&passwd);
    let ask = decode(fields);
    let target = target(&accounts, ask.user.as_deref(), sandbox_uid)?;
    let argv = program(&ask, target);
    if argv.is_empty() {
        return Err("no command given".to_owned());
    }
    let caller = accounts.iter().find(|a| a.uid == caller_uid);
    let env = environment(&ask, target, caller, caller_uid, context.base_env, &argv);
    let as_root = target.uid == 0;
    let open = |path: &str| {
        let open = || context.root.open_in_root(path, OFlags::PATH | OFlags::DIRECTORY, Mode::empty());
        if as_root { context.root.as_sandbox_root(open) } else { context.root.as_sandbox_user(open) }
    };
    // A login shell starts in the target's home, or in `/` where the sandbox has none (root's `/root`).
    let (cwd_path, cwd) = if ask.login {
        match open(&target.home) {
            Ok(fd) => (target.home.clone(), fd),
            Err(_) => ("/".to_owned(), open("/").map_err(|e| format!("opening /: {}", e.message))?),
        }
    } else {
        let path = ask.cwd.clone().unwrap_or_else(|| "/".to_owned());
        let fd = open(&path).map_err(|e| format!("unable to change directory to {path}: {}", e.message))?;
        (path, fd)
    };
    let stdio = Stdio {
        stdin: stdio[0].as_raw_fd(),
        stdout: stdio[1].as_raw_fd(),
        stderr: stdio[2].as_raw_fd(),
        controlling_terminal: false,
    };
    let request = LaunchRequest { argv: &argv, env: &env, cwd_path: &cwd_path, cwd: cwd.as_fd(), stdio, as_root };
    context.launcher.launch(&request)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n\
                          nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nbroken line\n";

    fn fields(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    /// The client is compiled on its own (no crates), so it repeats these; they must not drift apart.
    #[test]
    fn the_client_speaks_this_protocol_at_this_path() {
        let client = include_str!("../../../sudo/src/main.rs");
        let protocol = String::from_utf8_lossy(PROTOCOL);
        for line in [
            format!("const SOCKET_PATH: &str = \"{SOCKET_PATH}\";"),
            format!("const PROTOCOL: &str = \"{protocol}\";"),
            "const MAX_REQUEST: usize = 128 << 10;".to_owned(),
        ] {
            assert!(client.contains(&line), "crates/sudo/src/main.rs lacks `{line}`");
        }
        assert_eq!(MAX_REQUEST, 128 << 10);
        assert_eq!(SOCKET_PATH, format!("{RUN_DIR}/sudo.sock"));
        assert_eq!(CLIENT_PATH, format!("{RUN_DIR}/bin/sudo"));
    }

    #[test]
    fn only_root_and_the_sandbox_user_are_targets() {
        let accounts = accounts(PASSWD);
        assert_eq!(accounts.len(), 3, "the broken line is skipped");
        assert_eq!(target(&accounts, None, 1000).unwrap().uid, 0);
        assert_eq!(target(&accounts, Some("user"), 1000).unwrap().home, "/home/user");
        assert_eq!(target(&accounts, Some("#1000"), 1000).unwrap().name, "user");
        assert!(target(&accounts, Some("nobody"), 1000).unwrap_err().contains("root or the sandbox user"));
        assert_eq!(target(&accounts, Some("mallory"), 1000).unwrap_err(), "unknown user mallory");
    }

    #[test]
    fn requests_need_the_protocol_known_fields_and_a_final_nul() {
        assert!(parse_fields(b"sandkasten-sudo 1\0aid\0").is_ok());
        assert!(parse_fields(b"sandkasten-sudo 1\0aid").is_err());
        assert!(parse_fields(b"sandkasten-sudo 2\0aid\0").is_err());
        assert!(parse_fields(b"sandkasten-sudo 1\0zap\0").is_err());
        assert!(parse_fields(b"sandkasten-sudo 1\0\0").is_err(), "an empty field has no tag");
        assert!(parse_fields(b"\0").is_err());
    }

    #[test]
    fn the_environment_is_reset_unless_preserved() {
        let accounts = accounts(PASSWD);
        let base = BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]);
        let ask = decode(&fields(&["aenv", "eSECRET=1", "eTERM=xterm", "ePATH=/evil", "vFOO=bar", "cx"]));
        let env = environment(&ask, &accounts[0], Some(&accounts[1]), 1000, &base, &["env".to_owned()]);
        assert!(!env.contains_key("SECRET"));
        assert_eq!(env["TERM"], "xterm");
        assert_eq!(env["PATH"], "/usr/bin:/bin", "PATH is the sandbox's, not the caller's");
        assert_eq!(env["HOME"], "/root");
        assert_eq!(env["USER"], "root");
        assert_eq!(env["SUDO_USER"], "user");
        assert_eq!(env["SUDO_UID"], "1000");
        assert_eq!(env["FOO"], "bar");
        let preserved = decode(&fields(&["E", "aenv", "eSECRET=1", "eHOME=/home/user"]));
        let env = environment(&preserved, &accounts[0], Some(&accounts[1]), 1000, &base, &["env".to_owned()]);
        assert_eq!(env["SECRET"], "1");
        assert_eq!(env["HOME"], "/home/user", "-E keeps HOME unless -H");
    }

    #[test]
    fn shells_run_the_command_quoted_as_sudo_does() {
        let accounts = accounts(PASSWD);
        let ask = decode(&fields(&["l", "aecho", "a$HOME a;b"]));
        assert_eq!(program(&ask, &accounts[0]), ["/bin/bash", "-l", "-c", "echo $HOME\\ a\\;b"]);
        let ask = decode(&fields(&["s", "eSHELL=/bin/sh"]));
        assert_eq!(program(&ask, &accounts[0]), ["/bin/sh"]);
        let ask = decode(&fields(&["aid", "a-u"]));
        assert_eq!(program(&ask, &accounts[0]), ["id", "-u"]);
    }
}
