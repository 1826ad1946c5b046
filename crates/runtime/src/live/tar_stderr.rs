//! What GNU tar says on stderr while it archives a sandbox's files: the first few KiB kept for an error message, and
//! every line classified as it arrives. A file the archive's listing named but that was gone when tar came to it is
//! tar's exit code 2 ("Cannot stat: No such file or directory": names tar is handed are its top level, where a missing
//! one is an error), yet for a live sandbox it is only a file removed meanwhile, as the exit code 1 of a file that
//! changed while read is. So exit codes 1 and 2 stand for a failure only when some line says something else (`find`
//! failing on a directory the user cannot read is the pipeline's 1 too). Lines are
//! read in the C locale (the archiving command sets `LC_ALL=C`); tar quotes the names it prints, so a name cannot
//! break a line.

/// Most of tar's own complaints kept for an error message.
pub(super) const MAX_KEPT: usize = 4096;
/// A line longer than this (no name tar prints is) is taken as a real complaint.
const MAX_LINE: usize = 64 << 10;

/// The endings of what tar (or `find`, listing for it) says about a file that changed or went away while read, that
/// shrank while read (the archive holds it padded with zeros), or that it leaves out by its nature (a socket).
const HARMLESS: [&str; 7] = [
    ": No such file or directory",
    ": file changed as we read it",
    ": File removed before we read it",
    " bytes; padding with zeros",
    " byte; padding with zeros",
    ": socket ignored",
    ": door ignored",
];
/// tar's closing line after any error.
const CLOSING: &str = ": Exiting with failure status due to previous errors";
/// Most of the first complaint kept apart (it leads the error message, however many harmless lines came first).
const MAX_COMPLAINT: usize = 1024;

/// tar's stderr as it arrives.
#[derive(Debug, Default)]
pub(super) struct TarStderr {
    kept: Vec<u8>,
    line: Vec<u8>,
    line_too_long: bool,
    /// The first line that is not about a file changing or going away, once seen.
    complaint: Option<String>,
}

impl TarStderr {
    /// Takes the next piece of stderr.
    pub(super) fn push(&mut self, data: &[u8]) {
        let room = MAX_KEPT.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&data[..data.len().min(room)]);
        for piece in data.split_inclusive(|byte| *byte == b'\n') {
            let (text, ends) = match piece.strip_suffix(b"\n") {
                Some(text) => (text, true),
                None => (piece, false),
            };
            if self.line.len() + text.len() > MAX_LINE {
                self.line_too_long = true;
            } else {
                self.line.extend_from_slice(text);
            }
            if ends {
                self.end_line();
            }
        }
    }

    fn end_line(&mut self) {
        let line = String::from_utf8_lossy(&self.line);
        let line = line.trim_end();
        let harmless = !self.line_too_long
            && (line.is_empty() || HARMLESS.iter().any(|ending| line.ends_with(ending)) || line.ends_with(CLOSING));
        if !harmless && self.complaint.is_none() {
            let cut = (0..=MAX_COMPLAINT.min(line.len())).rev().find(|at| line.is_char_boundary(*at)).unwrap_or(0);
            self.complaint = Some(line[..cut].to_owned());
        }
        self.line.clear();
        self.line_too_long = false;
    }

    /// True when everything tar said was about files that changed or went away while it read them (or nothing);
    /// and what it said for an error message (its first complaint first).
    pub(super) fn only_vanished_files(mut self) -> (bool, Vec<u8>) {
        if !self.line.is_empty() || self.line_too_long {
            self.end_line();
        }
        match self.complaint {
            None => (true, self.kept),
            Some(complaint) if String::from_utf8_lossy(&self.kept).contains(&complaint) => (false, self.kept),
            Some(complaint) => {
                let mut said = complaint.into_bytes();
                said.extend_from_slice(b"\n(what tar said first:)\n");
                said.extend_from_slice(&self.kept);
                (false, said)
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn said(pieces: &[&str]) -> (bool, Vec<u8>) {
        let mut stderr = TarStderr::default();
        for piece in pieces {
            stderr.push(piece.as_bytes());
        }
        stderr.only_vanished_files()
    }

    #[test]
    fn files_gone_or_changed_while_read_are_no_complaint() {
        let lines = [
            "/usr/bin/tar: tmp/churn-100: Cannot stat: No such file or directory\n",
            "/usr/bin/tar: tmp/churn-65: file changed as we read it\n",
            "/usr/bin/tar: tmp/a/b: File removed before we read it\n",
            "/usr/bin/tar: tmp/log: File shrank by 120 bytes; padding with zeros\n",
            "/usr/bin/tar: tmp/.X11-unix/X0: socket ignored\n",
            "find: 'tmp/gone': No such file or directory\n",
            "/usr/bin/tar: Exiting with failure status due to previous errors\n",
        ];
        assert!(said(&lines).0);
        assert!(said(&[]).0);
        // Split anywhere, even inside a line.
        let whole = lines.concat();
        let (left, right) = whole.split_at(37);
        assert!(said(&[left, right]).0);
    }

    #[test]
    fn anything_else_is_a_complaint_and_is_kept_for_the_message() {
        let denied = "/usr/bin/tar: tmp/secret: Cannot open: Permission denied\n";
        let (only_vanished, kept) = said(&["/usr/bin/tar: tmp/x: Cannot stat: No such file or directory\n", denied]);
        assert!(!only_vanished);
        assert!(String::from_utf8(kept).unwrap().contains("Permission denied"));
        // A last line without its newline counts too.
        assert!(!said(&["/usr/bin/tar: tmp/d: Cannot savedir: Permission denied"]).0);
        assert!(!said(&["/usr/bin/tar: -: Cannot write: Broken pipe\n"]).0);
        // A name made to look like a harmless message does not hide the error after it.
        assert!(!said(&["/usr/bin/tar: tmp/a\\: File shrank by : Cannot open: Permission denied\n"]).0);
        assert!(!said(&["find: 'workspace': Permission denied\n"]).0);
    }

    #[test]
    fn the_message_keeps_only_the_first_kib_and_an_endless_line_is_a_complaint() {
        let noise = "/usr/bin/tar: tmp/x: Cannot stat: No such file or directory\n".repeat(500);
        let (only_vanished, kept) = said(&[&noise]);
        assert!(only_vanished);
        assert_eq!(kept.len(), MAX_KEPT);
        // A complaint after many harmless lines leads the message.
        let (only_vanished, said_then) = said(&[&noise, "/usr/bin/tar: tmp/s: Cannot open: Permission denied\n"]);
        assert!(!only_vanished);
        assert!(String::from_utf8_lossy(&said_then).starts_with("/usr/bin/tar: tmp/s: Cannot open: Permission denied"));
        let endless = "x".repeat(MAX_LINE + 1) + ": No such file or directory\n";
        assert!(!said(&[&endless]).0);
    }
}
