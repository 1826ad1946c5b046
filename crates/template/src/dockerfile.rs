//! A Dockerfile subset translated to a [`TemplateSpec`]: `FROM` (`host`, `debian:bookworm`, `debian:trixie` or a
//! template name), `RUN`, `COPY`, `ENV`, `WORKDIR`, `USER`. Anything else is refused naming the instruction and its
//! line, never silently dropped.

use std::collections::BTreeMap;

use crate::error::SpecError;
use crate::spec::{Base, FileSpec, Packages, TemplateSpec};

/// One instruction: its 1-based line, keyword (upper case) and arguments (continuations joined).
struct Instruction {
    line: usize,
    keyword: String,
    arguments: String,
}

/// The instructions of `text`: comments and blank lines skipped, `\` continuations joined.
fn instructions(text: &str) -> Vec<Instruction> {
    let mut found = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (index, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if pending.is_none() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((index + 1, String::new()));
        if let Some(body) = trimmed.strip_suffix('\\') {
            joined.push_str(body);
            joined.push(' ');
            pending = Some((start, joined));
            continue;
        }
        joined.push_str(trimmed);
        found.push(instruction(start, &joined));
    }
    if let Some((start, joined)) = pending {
        found.push(instruction(start, &joined));
    }
    found
}

fn instruction(line: usize, text: &str) -> Instruction {
    let (keyword, arguments) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    Instruction { line, keyword: keyword.to_ascii_uppercase(), arguments: arguments.trim().to_owned() }
}

/// Translates a Dockerfile into a spec named `name`. `COPY` sources are relative to the Dockerfile's directory.
pub fn translate(text: &str, name: &str) -> Result<TemplateSpec, SpecError> {
    let mut base = None;
    let mut files = Vec::new();
    let mut run = Vec::new();
    let mut env = BTreeMap::new();
    let (mut workdir, mut user) = (None, None);
    for Instruction { line, keyword, arguments } in instructions(text) {
        let bad = |message: String| SpecError::Dockerfile { line, message };
        match keyword.as_str() {
            "FROM" if base.is_some() => return Err(bad("a second FROM: multi-stage builds are not supported".into())),
            "FROM" => {
                let image = arguments.split_whitespace().next().unwrap_or_default();
                base = Some(Base::try_from(image.to_owned()).map_err(bad)?);
            }
            _ if base.is_none() => {
                return Err(bad(format!("{keyword} before FROM: start with FROM host or FROM debian:bookworm")));
            }
            "RUN" => run.push(shell_form(&arguments).map_err(bad)?),
            "COPY" => {
                if !run.is_empty() {
                    return Err(bad("COPY after RUN: files are copied before every RUN step; move the COPY up".into()));
                }
                files.push(copy(&arguments).map_err(bad)?);
            }
            "ENV" => env.extend(env_pairs(&arguments).map_err(bad)?),
            "WORKDIR" => workdir = Some(arguments.clone()),
            "USER" => user = Some(arguments.clone()),
            other => {
                return Err(bad(format!(
                    "{other} is not supported (this subset has FROM, RUN, COPY, ENV, WORKDIR, USER): remove it or \
                     write the template as TOML"
                )));
            }
        }
    }
    let Some(base) = base else {
        return Err(SpecError::Dockerfile {
            line: 1,
            message: "no FROM: start with FROM host or FROM debian:bookworm".into(),
        });
    };
    let spec = TemplateSpec {
        name: name.to_owned(),
        base,
        packages: Packages::default(),
        files,
        env,
        workdir,
        user,
        run,
        ready: None,
        preload: Vec::new(),
    };
    spec.validate()?;
    Ok(spec)
}

/// `RUN cmd` as it is, or `RUN ["prog", "arg"]` quoted for bash.
fn shell_form(arguments: &str) -> Result<String, String> {
    if arguments.starts_with('[') {
        let words: Vec<String> = serde_json::from_str(arguments)
            .map_err(|e| format!("RUN's exec form must be a JSON array of strings: {e}"))?;
        return Ok(words.iter().map(|word| shell_quote(word)).collect::<Vec<_>>().join(" "));
    }
    if arguments.is_empty() {
        return Err("RUN without a command".to_owned());
    }
    Ok(arguments.to_owned())
}

fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// `COPY [--chmod=MODE] SRC DEST`: one source per line.
fn copy(arguments: &str) -> Result<FileSpec, String> {
    let mut mode = None;
    let mut words = Vec::new();
    for word in arguments.split_whitespace() {
        match word.strip_prefix("--chmod=") {
            Some(octal) => {
                mode = Some(u32::from_str_radix(octal, 8).map_err(|_| format!("--chmod={octal} is not an octal mode"))?)
            }
            None if word.starts_with("--") => return Err(format!("COPY {word} is not supported (only --chmod)")),
            None => words.push(word),
        }
    }
    match words.as_slice() {
        [src, dest] => Ok(FileSpec { src: (*src).to_owned(), dest: (*dest).to_owned(), mode }),
        _ => Err("COPY takes one source and one destination: COPY [--chmod=0755] SRC /opt/DEST".to_owned()),
    }
}

/// `ENV K=V [K2=V2 ...]` (values may be double-quoted) or `ENV K V`.
fn env_pairs(arguments: &str) -> Result<Vec<(String, String)>, String> {
    if !arguments.contains('=') || arguments.split_whitespace().next().is_some_and(|first| !first.contains('=')) {
        let (key, value) = arguments.split_once(char::is_whitespace).ok_or("ENV needs a name and a value")?;
        return Ok(vec![(key.to_owned(), value.trim().to_owned())]);
    }
    let mut pairs = Vec::new();
    let mut rest = arguments.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=').ok_or_else(|| format!("{rest:?} is not NAME=VALUE"))?;
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"').ok_or("an unterminated quote")?;
                (quoted[..end].to_owned(), &quoted[end + 1..])
            }
            None => {
                let end = after.find(char::is_whitespace).unwrap_or(after.len());
                (after[..end].to_owned(), &after[end..])
            }
        };
        pairs.push((key.trim().to_owned(), value));
        rest = next.trim_start();
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subset_translates_to_a_spec() {
        let spec = translate(
            "# a comment\nFROM host\nCOPY --chmod=0755 tool.sh /opt/app/tool.sh\nENV A=1 B=\"two words\"\n\
             ENV C 3\nWORKDIR /opt/app\nUSER user\nRUN echo one && \\\n    echo two\nRUN [\"echo\", \"it's\"]\n",
            "demo",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spec.base, Base::Host);
        assert_eq!(
            spec.files,
            vec![FileSpec { src: "tool.sh".into(), dest: "/opt/app/tool.sh".into(), mode: Some(0o755) }]
        );
        assert_eq!(spec.env.get("B").map(String::as_str), Some("two words"));
        assert_eq!(spec.env.get("C").map(String::as_str), Some("3"));
        assert_eq!(spec.run, vec!["echo one &&  echo two".to_owned(), "'echo' 'it'\\''s'".to_owned()]);
        assert_eq!(spec.workdir.as_deref(), Some("/opt/app"));
        assert_eq!(spec.user.as_deref(), Some("user"));
        let debian = translate("FROM debian:bookworm\n", "d").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(debian.base, Base::Debian(crate::spec::DebianSuite::Bookworm));
    }

    #[test]
    fn unsupported_instructions_are_named_with_their_line() {
        for (text, needle) in [
            ("FROM host\nEXPOSE 80\n", "line 2: EXPOSE is not supported"),
            ("FROM host\nCMD [\"x\"]\n", "line 2: CMD is not supported"),
            ("RUN x\n", "line 1: RUN before FROM"),
            ("FROM host\nFROM host\n", "line 2: a second FROM"),
            ("FROM host\nRUN a\nCOPY x /opt/x\n", "line 3: COPY after RUN"),
            ("FROM ubuntu:22.04\n", "line 1: base \"ubuntu:22.04\""),
            ("FROM host\nCOPY --from=b x /opt/x\n", "line 2: COPY --from=b"),
            ("", "no FROM"),
        ] {
            let message = translate(text, "t").err().map(|e| e.to_string()).unwrap_or_default();
            assert!(message.contains(needle), "{text:?}: {message}");
        }
        let dest = translate("FROM host\nCOPY x /usr/x\n", "t").err().and_then(|e| e.field().map(str::to_owned));
        assert_eq!(dest.as_deref(), Some("files[0].dest"));
    }
}
