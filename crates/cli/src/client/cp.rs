//! `sandbox cp`: copy one file into (`cp LOCAL ID:PATH`) or out of (`cp ID:PATH LOCAL`) a sandbox through the files
//! API, bytes unchanged. `-` is stdin or stdout; a relative sandbox path is under /workspace; a destination that is a
//! directory (or ends with `/`) gets the source's file name. Directories go both ways as tar archives (`cp_dir`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::client::commands::sandbox_path;
use crate::client::cp_dir;
use crate::client::http::{Client, ClientError};

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    /// A local path, or `-`.
    Local(String),
    /// A sandbox id and a path inside it.
    Remote { id: String, path: String },
}

fn parse(text: &str) -> Endpoint {
    match text.split_once(':') {
        Some((id, path)) if id.starts_with("sb-") && !id.contains('/') => {
            let path = if path.starts_with('/') { path.to_owned() } else { format!("/workspace/{path}") };
            Endpoint::Remote { id: id.to_owned(), path }
        }
        _ => Endpoint::Local(text.to_owned()),
    }
}

fn file_name(path: &str) -> &str {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or_default()
}

fn upload(client: &Client, local: &str, id: &str, path: &str) -> Result<(), ClientError> {
    if local != "-" && Path::new(local).is_dir() {
        let path = if path.ends_with('/') { format!("{path}{}", file_name(local)) } else { path.to_owned() };
        return cp_dir::upload(client, Path::new(local), id, &path);
    }
    let data = if local == "-" {
        let mut data = Vec::new();
        std::io::stdin()
            .read_to_end(&mut data)
            .map_err(|e| ClientError::input(format!("reading standard input failed: {e}")))?;
        data
    } else {
        std::fs::read(local).map_err(|e| ClientError::input(format!("cannot read '{local}': {e}")))?
    };
    let path = match path.ends_with('/') {
        true if local == "-" => return Err(ClientError::input("give the sandbox file's name when copying from -")),
        true => format!("{path}{}", file_name(local)),
        false => path.to_owned(),
    };
    let query = [("path".to_owned(), path)];
    client.put_bytes(&format!("{}/files", sandbox_path(id)?), &query, &data)
}

fn download(client: &Client, id: &str, path: &str, local: &str) -> Result<(), ClientError> {
    let query = [("path".to_owned(), path.to_owned())];
    let stat = client.get_json(&format!("{}/files/stat", sandbox_path(id)?), &query);
    if local != "-" && stat.is_ok_and(|info| info["kind"] == "dir") {
        return cp_dir::download(client, id, path, local);
    }
    let data = client.get_bytes(&format!("{}/files", sandbox_path(id)?), &query)?;
    if local == "-" {
        let mut out = std::io::stdout().lock();
        return out
            .write_all(&data)
            .and_then(|()| out.flush())
            .map_err(|e| ClientError::input(format!("writing to standard output failed: {e}")));
    }
    let mut target = PathBuf::from(local);
    if local.ends_with('/') || Path::new(local).is_dir() {
        target.push(file_name(path));
    }
    std::fs::write(&target, &data).map_err(|e| ClientError::input(format!("cannot write '{}': {e}", target.display())))
}

/// Copies `source` to `destination`; exactly one of them is `ID:PATH`.
pub fn copy(client: &Client, source: &str, destination: &str) -> Result<i32, ClientError> {
    match (parse(source), parse(destination)) {
        (Endpoint::Local(local), Endpoint::Remote { id, path }) => upload(client, &local, &id, &path)?,
        (Endpoint::Remote { id, path }, Endpoint::Local(local)) => download(client, &id, &path, &local)?,
        (Endpoint::Local(_), Endpoint::Local(_)) => {
            return Err(ClientError::input("one side of cp must be in a sandbox: ID:PATH (e.g. sb-…:/workspace/f)"));
        }
        (Endpoint::Remote { .. }, Endpoint::Remote { .. }) => {
            return Err(ClientError::input("cp copies between this machine and a sandbox, not between sandboxes"));
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_sides_are_id_colon_path() {
        let remote = |id: &str, path: &str| Endpoint::Remote { id: id.into(), path: path.into() };
        assert_eq!(parse("sb-0123456789abcdef:/tmp/x"), remote("sb-0123456789abcdef", "/tmp/x"));
        assert_eq!(parse("sb-0123456789abcdef:x/y"), remote("sb-0123456789abcdef", "/workspace/x/y"));
        assert_eq!(parse("./sb-1:x"), Endpoint::Local("./sb-1:x".into()));
        assert_eq!(parse("C:file"), Endpoint::Local("C:file".into()));
        assert_eq!(parse("-"), Endpoint::Local("-".into()));
        assert_eq!(file_name("/workspace/a/b.txt"), "b.txt");
    }
}
