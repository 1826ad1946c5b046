//! `sandkasten template push NAME` / `pull NAME`: copies a built template between the local cache and the template
//! store beside the snapshot store that `--config FILE`'s `[snapshots]` names (the server's default without it), so
//! another host, or a server reading another cache, can use it.

use std::path::{Path, PathBuf};

use sandkasten_template::TemplateCache;
use sandkasten_template_build::{ShareError, TemplateStore};

use crate::exit_codes;

/// Push (`true`) or pull the template `name` of the cache `cache` (else the config's); returns the exit code.
pub fn run(cache: Option<&Path>, name: &str, config: Option<&PathBuf>, push: bool) -> i32 {
    let config = match sandkasten_server::ServerConfig::load_with(config.map(PathBuf::as_path), |config| {
        // Only the store settings are read: the file's API keys are not needed.
        config.insecure_no_auth = true;
        Ok(())
    }) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("sandkasten: {error}");
            return exit_codes::BAD_INPUT;
        }
    };
    let store_config = config.snapshots.store_config(&config.database);
    let store = match TemplateStore::beside(&store_config) {
        Ok(store) => store,
        Err(error) => {
            eprintln!("sandkasten: the template store: {error}");
            return exit_codes::BAD_INPUT;
        }
    };
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
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sandkasten: starting the async runtime failed: {error}");
            return exit_codes::SANDBOX_ERROR;
        }
    };
    let outcome =
        runtime.block_on(async { if push { store.push(&cache, name).await } else { store.pull(&cache, name).await } });
    let direction = if push { "pushed" } else { "pulled" };
    match outcome {
        Ok(record) => {
            println!(
                "{direction} {} {} ({} layers) {}",
                record.name,
                record.digest,
                record.layers.len(),
                store_config.url
            );
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
