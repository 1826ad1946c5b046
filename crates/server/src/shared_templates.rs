//! With `[templates] share`: a template a request names that this host's cache lacks is pulled from the template
//! store first (another host built and pushed it), so that `built_templates::choose` finds it. What a flood of
//! requests naming templates nobody built can make the server spend is bounded: a name the store lacked is not looked
//! for again for `MISSING_FOR` (at most `MAX_MISSING` names remembered), and requests waiting for a pull wait on an
//! async lock (one pull at a time per server), never on a blocking thread. The pull runs in a task that owns both
//! locks, so a request that goes away mid-pull leaves it to finish.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandkasten_template::TemplateCache;
use sandkasten_template_build::{ShareError, TemplateStore};

use crate::built_templates::ChooseError;
use crate::config::ServerConfig;

/// How long a request waits for a pull in progress, or for the template cache's lock (a build holds it), before it
/// answers 409.
const LOCK_WAIT: Duration = Duration::from_secs(10);
/// How often the cache's lock is tried while a build holds it.
const LOCK_RETRY: Duration = Duration::from_millis(100);
/// How long a name the store lacked is answered as unknown without looking again.
pub(crate) const MISSING_FOR: Duration = Duration::from_secs(30);
/// Most names remembered as missing (the oldest is forgotten first).
const MAX_MISSING: usize = 1024;

/// Pulls of shared templates on this server.
#[derive(Debug, Default)]
pub(crate) struct SharedTemplates {
    /// Held by the pull in progress.
    pulling: Arc<tokio::sync::Mutex<()>>,
    /// Names the store lacked.
    missing: Arc<Missing>,
}

/// Names the store lacked, with when that was seen.
#[derive(Debug, Default)]
struct Missing(Mutex<HashMap<String, Instant>>);

impl Missing {
    /// True when the store lacked `name` less than `MISSING_FOR` before `now`.
    fn lately(&self, name: &str, now: Instant) -> bool {
        let missing = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        missing.get(name).is_some_and(|seen| now.saturating_duration_since(*seen) < MISSING_FOR)
    }

    fn remember(&self, name: &str, now: Instant) {
        let mut missing = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        missing.retain(|_, seen| now.saturating_duration_since(*seen) < MISSING_FOR);
        if missing.len() >= MAX_MISSING
            && let Some(oldest) = missing.iter().min_by_key(|(_, seen)| **seen).map(|(name, _)| name.clone())
        {
            missing.remove(&oldest);
        }
        missing.insert(name.to_owned(), now);
    }
}

impl SharedTemplates {
    /// Copies the template `name` from the template store into this host's cache when `config` shares templates and
    /// the cache lacks it. Nothing for a built-in layout, a template the cache has (a newer push is not looked for:
    /// `sandkasten template pull` takes it), or a name the store lacks (`choose` then says it is unknown).
    pub(crate) async fn fetch(&self, config: &ServerConfig, name: Option<&str>) -> Result<(), ChooseError> {
        let Some(name) = name.filter(|name| !matches!(*name, "host" | "e2b")) else { return Ok(()) };
        if !config.templates.share
            || sandkasten_template::spec::check_name(name).is_err()
            || self.missing.lately(name, Instant::now())
        {
            return Ok(());
        }
        let cache = open_cache(config).await?;
        if has_template(&cache, name).await? {
            return Ok(());
        }
        let busy = || {
            ChooseError::Busy(format!(
                "template {name:?} is not in this host's cache and the cache is busy (a build, or a pull for another \
                 request): retry in a moment"
            ))
        };
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        let pulling =
            tokio::time::timeout_at(deadline, Arc::clone(&self.pulling).lock_owned()).await.map_err(|_| busy())?;
        // Pulled, or found missing, by the request this one waited for.
        if self.missing.lately(name, Instant::now()) || has_template(&cache, name).await? {
            return Ok(());
        }
        let lock = loop {
            let trying = cache.clone();
            let locked = tokio::task::spawn_blocking(move || trying.try_lock())
                .await
                .map_err(|error| ChooseError::Cache(error.to_string()))?
                .map_err(|error| ChooseError::Cache(error.to_string()))?;
            match locked {
                Some(lock) => break lock,
                None if tokio::time::Instant::now() + LOCK_RETRY < deadline => tokio::time::sleep(LOCK_RETRY).await,
                None => return Err(busy()),
            }
        };
        let store = TemplateStore::beside(&config.snapshots.store_config(&config.database))
            .map_err(|error| ChooseError::Store(format!("the template store: {error}")))?;
        let (wanted, missing) = (name.to_owned(), Arc::clone(&self.missing));
        let pull = tokio::spawn(async move {
            let pulled = store.pull(&cache, &wanted).await;
            // Remembered before the locks go, so that a request waiting for them finds it (and also when the request
            // that started the pull went away).
            if let Err(ShareError::NotInStore(_)) = &pulled {
                missing.remember(&wanted, Instant::now());
            }
            drop((lock, pulling));
            pulled
        });
        match pull.await.map_err(|error| ChooseError::Cache(error.to_string()))? {
            Ok(record) => {
                tracing::info!(template = %name, digest = %record.digest, "template pulled from the template store");
                Ok(())
            }
            Err(ShareError::NotInStore(_)) => Ok(()),
            Err(error @ ShareError::Store(_)) => {
                Err(ChooseError::Store(format!("pulling template {name:?} from the template store: {error}")))
            }
            Err(error) => Err(ChooseError::Cache(format!("pulling template {name:?} into this host's cache: {error}"))),
        }
    }
}

async fn open_cache(config: &ServerConfig) -> Result<TemplateCache, ChooseError> {
    let root = config.templates.cache_root();
    tokio::task::spawn_blocking(move || TemplateCache::open(&root))
        .await
        .map_err(|error| ChooseError::Cache(error.to_string()))?
        .map_err(|error| ChooseError::Cache(error.to_string()))
}

async fn has_template(cache: &TemplateCache, name: &str) -> Result<bool, ChooseError> {
    let (cache, name) = (cache.clone(), name.to_owned());
    tokio::task::spawn_blocking(move || cache.template(&name).is_ok())
        .await
        .map_err(|error| ChooseError::Cache(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_name_is_remembered_for_a_while_and_the_memory_is_bounded() {
        let missing = Missing::default();
        let start = Instant::now();
        assert!(!missing.lately("tables", start));
        missing.remember("tables", start);
        assert!(missing.lately("tables", start + MISSING_FOR / 2));
        assert!(!missing.lately("tables", start + MISSING_FOR));
        assert!(!missing.lately("other", start));
        for index in 0..MAX_MISSING + 10 {
            missing.remember(&format!("name-{index}"), start + Duration::from_millis(index as u64));
        }
        let remembered = missing.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len();
        assert_eq!(remembered, MAX_MISSING);
        assert!(!missing.lately("name-0", start + Duration::from_secs(1)), "the oldest is forgotten first");
        assert!(missing.lately(&format!("name-{}", MAX_MISSING + 9), start + Duration::from_secs(1)));
    }
}
