//! `sandkasten template push NAME` / `pull NAME`: copies a built template between the local cache and the template
//! store beside the snapshot store that `--config FILE`'s `[snapshots]` names (the server's default without it), so
//! another host, or a server reading another cache, can use it; `prune` deletes old versions from the store.

use std::path::{Path, PathBuf};

use sandkasten_template::TemplateCache;
use sandkasten_template_build::{ShareError, TemplateStore};

use crate::exit_codes;

/// The server config `config` names (only its store settings are read: the file's API keys are not needed), and
/// the template store beside its snapshot store; else the exit code.
fn open_store(config: Option<&PathBuf>) -> Result<(sandkasten_server::ServerConfig, TemplateStore), i32> {
    let config = sandkasten_server::ServerConfig::load_with(config.map(PathBuf::as_path), |config| {
        config.insecure_no_auth = true;
        Ok(())
    })
    .map_err(|error| {
        eprintln!("sandkasten: {error}");
        exit_codes::BAD_INPUT
    })?;
    let store = TemplateStore::beside(&config.snapshots.store_config(&config.database)).map_err(|error| {
        eprintln!("sandkasten: the template store: {error}");
        exit_codes::BAD_INPUT
    })?;
    Ok((config, store))
}

fn async_runtime() -> Result<tokio::runtime::Runtime, i32> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|error| {
        eprintln!("sandkasten: starting the async runtime failed: {error}");
        exit_codes::SANDBOX_ERROR
    })
}

/// Push (`true`) or pull the template `name` of the cache `cache` (else the config's); returns the exit code.
pub fn run(cache: Option<&Path>, name: &str, config: Option<&PathBuf>, push: bool) -> i32 {
    let (config, store) = match open_store(config) {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    let store_url = config.snapshots.store_config(&config.database).url;
    let root = cache.map_or_else(|| config.templates.cache_root(), Path::to_path_buf);
    let cache = match TemplateCache::open(&root) {
        Ok(cache) => cache,
        Err(error) => {
            eprintln!("sandkasten: the template cache: {error}");
            return exit_codes::SANDBOX_ERROR;
        }
    };
    let _lock = match super::build::lock(&cache) {
        Ok(lock) => lock,
        Err(code) => return code,
    };
    let runtime = match async_runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let outcome =
        runtime.block_on(async { if push { store.push(&cache, name).await } else { store.pull(&cache, name).await } });
    let direction = if push { "pushed" } else { "pulled" };
    match outcome {
        Ok(record) => {
            println!("{direction} {} {} ({} layers) {}", record.name, record.digest, record.layers.len(), store_url);
            0
        }
        Err(
            error
            @ (ShareError::NotInStore(_) | ShareError::Cache(sandkasten_template::CacheError::UnknownTemplate(_))),
        ) => {
            eprintln!("sandkasten: {error}");
            exit_codes::BAD_INPUT
        }
        Err(error) => {
            eprintln!("sandkasten: {} {name}: {error}", if push { "pushing" } else { "pulling" });
            exit_codes::SANDBOX_ERROR
        }
    }
}

/// Deletes all but the newest `keep` versions of each template (of `names`, when given) from the store; returns the
/// exit code.
pub fn prune(names: &[String], keep: usize, config: Option<&PathBuf>, json: bool) -> i32 {
    if keep == 0 && names.is_empty() {
        eprintln!("sandkasten: --keep 0 deletes every version: name the templates to delete from the store");
        return exit_codes::BAD_INPUT;
    }
    if let Some((bad, error)) =
        names.iter().find_map(|name| sandkasten_template::spec::check_name(name).err().map(|error| (name, error)))
    {
        eprintln!("sandkasten: {bad:?} is not a template name: {error}");
        return exit_codes::BAD_INPUT;
    }
    let (_, store) = match open_store(config) {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    let runtime = match async_runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(store.prune(keep, names)) {
        Ok(report) => {
            if json {
                println!("{}", serde_json::to_string(&report).unwrap_or_default());
            } else {
                for version in &report.deleted {
                    println!("deleted {} {}", version.name, version.digest);
                }
                println!(
                    "{} versions deleted, {} kept; {} chunks ({}) freed",
                    report.deleted.len(),
                    report.kept,
                    report.chunks_deleted,
                    indicatif::HumanBytes(report.bytes_deleted)
                );
            }
            for failure in &report.failed {
                eprintln!("sandkasten: deleting {} {} failed: {}", failure.name, failure.digest, failure.error);
            }
            if let Some(error) = &report.collection_failed {
                eprintln!("sandkasten: collecting the store's unreferenced chunks failed: {error}");
            }
            if report.failed.is_empty() && report.collection_failed.is_none() { 0 } else { exit_codes::SANDBOX_ERROR }
        }
        Err(error) => {
            eprintln!("sandkasten: pruning the template store: {error}");
            exit_codes::SANDBOX_ERROR
        }
    }
}
