//! Copying a sandbox's writable files into others: one tar out of the source (`SandboxRuntime::export_files`), its chunks handed
//! to every target's import in turn (`import_files`), so a fork of N reads the source once and the slowest target
//! sets the pace; nothing is held in the server beyond a few chunks per target.

use sandkasten_types::Failure;
use tokio::sync::mpsc;

use crate::state::AppState;

/// Chunks in flight per stream.
const IN_FLIGHT: usize = 4;

/// Copies `dirs` of `source` into each of `targets` (unpacked at `/`). Fails with the cause: the target that stopped
/// taking the archive (tar's words on what it could not unpack), else the source's failure, else a target's.
pub(crate) async fn copy_files(
    state: &AppState,
    source: &str,
    dirs: Vec<String>,
    targets: &[String],
) -> Result<(), Failure> {
    let runtime = state.runtime();
    let (out, mut chunks) = mpsc::channel::<Vec<u8>>(IN_FLIGHT);
    let mut inputs = Vec::with_capacity(targets.len());
    let mut imports = Vec::with_capacity(targets.len());
    for target in targets {
        let (input, source) = mpsc::channel(IN_FLIGHT);
        inputs.push(input);
        imports.push(runtime.import_files(target, source));
    }
    // True when a target stopped taking chunks: its failure is then the cause, and the export's the consequence.
    let tee = async move {
        while let Some(chunk) = chunks.recv().await {
            for input in &inputs {
                if input.send(chunk.clone()).await.is_err() {
                    return true;
                }
            }
        }
        false
    };
    let (exported, target_stopped, imported) =
        tokio::join!(runtime.export_files(source, dirs, out), tee, futures::future::join_all(imports));
    let imported = imported.into_iter().collect::<Result<Vec<()>, Failure>>();
    if target_stopped {
        imported?;
        exported
    } else {
        // A source that failed half-way leaves the targets a truncated archive: the source's failure is the cause.
        exported?;
        imported.map(|_| ())
    }
}
