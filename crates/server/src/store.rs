//! Durable state in SQLite (WAL, migrations): which sandboxes exist, whose they are, their isolation tier, spec,
//! metadata and lifetime, and the commands run in them. One connection behind a mutex, used only inside `spawn_blocking`.
//!
//! A sandbox row is written *before* the runtime creates the sandbox and is the only place quotas are counted, so
//! the quota check and the insert happen in one transaction.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, Row, params};
use sandkasten_types::{CommandExit, Isolation, SandboxSpec, Tier};
use thiserror::Error;

use crate::migrations::{self, MigrationError};
pub use crate::sandbox_lifecycle::Lifecycle;
use crate::seal::rows::RowsError;
use crate::seal::{SealError, SealKeys};

/// A database failure. Never caused by a client's input.
#[derive(Debug, Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A stored JSON column could not be (de)serialised.
    #[error("stored json: {0}")]
    Json(#[from] serde_json::Error),
    /// The database directory could not be created.
    #[error("cannot create the database directory: {0}")]
    Directory(std::io::Error),
    /// The database was written by a newer sandkasten.
    #[error("database schema version {found} is newer than this build's {known}: upgrade sandkasten")]
    NewerSchema {
        /// Version found in the file.
        found: u32,
        /// Newest version this build knows.
        known: u32,
    },
    /// A stored state is not one this build knows.
    #[error("unknown sandbox state {0:?} in the database")]
    UnknownState(String),
    /// A stored isolation tier is not one this build knows.
    #[error("unknown isolation tier {0:?} in the database")]
    UnknownTier(String),
    /// A secret value could not be sealed or opened (an altered row, a key the server does not have).
    #[error(transparent)]
    Seal(#[from] SealError),
    /// A thread panicked while holding the connection.
    #[error("database connection poisoned by a panic")]
    Poisoned,
    /// The database was closed (the server stopped).
    #[error("the database is closed: the server has stopped")]
    Closed,
    /// The blocking task did not complete.
    #[error("database task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

impl From<RowsError> for StoreError {
    fn from(error: RowsError) -> Self {
        match error {
            RowsError::Sqlite(error) => StoreError::Sqlite(error),
            RowsError::Seal(error) => StoreError::Seal(error),
        }
    }
}

impl From<MigrationError> for StoreError {
    fn from(error: MigrationError) -> Self {
        match error {
            MigrationError::Sqlite(error) => StoreError::Sqlite(error),
            MigrationError::NewerSchema { found, known } => StoreError::NewerSchema { found, known },
            MigrationError::Seal(error) => StoreError::Seal(error),
        }
    }
}

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    /// Created and usable.
    Running,
    /// Deleted by its tenant.
    Destroyed,
    /// Its processes were found dead (e.g. after a daemon restart).
    Lost,
    /// Its timeout passed and it was destroyed.
    Expired,
    /// Alive but paused (stored as `running` with `paused_ms` set: it is still the runtime's, but takes no CPU, does
    /// not count against the running quota and its timeout clock stands still).
    Paused,
}

impl SandboxState {
    /// The name stored in the database and shown in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Destroyed => "destroyed",
            SandboxState::Lost => "lost",
            SandboxState::Expired => "expired",
            SandboxState::Paused => "paused",
        }
    }

    /// Parses a stored or requested state name.
    pub fn parse(name: &str) -> Option<SandboxState> {
        match name {
            "running" => Some(SandboxState::Running),
            "destroyed" => Some(SandboxState::Destroyed),
            "lost" => Some(SandboxState::Lost),
            "expired" => Some(SandboxState::Expired),
            "paused" => Some(SandboxState::Paused),
            _ => None,
        }
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One sandbox as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRecord {
    /// `sb-` + 16 hex digits.
    pub id: String,
    /// Owning tenant.
    pub tenant: String,
    /// Current state.
    pub state: SandboxState,
    /// What it was created with; `spec.isolation` is always set (rows from before tiers read as `process`).
    pub spec: SandboxSpec,
    /// The tier it runs on (`spec.isolation`'s), why, and how a microVM's guest runs (rows from before this column
    /// read as the tier, `requested`).
    pub isolation: Isolation,
    /// Client-defined labels.
    pub metadata: BTreeMap<String, String>,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: i64,
    /// When it expires (or expired), ms since the Unix epoch; for a paused sandbox, when it would have expired had
    /// it not been paused (a resume moves it on by the pause).
    pub expires_ms: i64,
    /// When it was paused, while it is.
    pub paused_ms: Option<i64>,
    /// What happens at its timeout and to requests while it is paused.
    pub lifecycle: Lifecycle,
    /// The snapshot holding its files while it is paused to the filesystem (`PauseMode::Filesystem`); a paused
    /// sandbox without one is paused with its memory.
    pub pause_snapshot: Option<String>,
    /// When it stopped running, ms since the Unix epoch.
    pub ended_ms: Option<i64>,
    /// Why it stopped running.
    pub end_reason: Option<String>,
}

/// A tenant's quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Sandboxes running at once.
    pub max_sandboxes: u64,
    /// Sum of the running sandboxes' memory limits, in bytes.
    pub max_memory_bytes: u64,
    /// Sum of the running sandboxes' `pids` limits.
    pub max_pids: u64,
    /// Command output held in the server's memory for all running sandboxes at once, in bytes (enforced as it is
    /// held, not at admission).
    pub max_output_bytes: u64,
    /// Bytes the tenant's snapshots take in the snapshot store (compressed), all together.
    pub max_snapshot_bytes: u64,
}

/// Why a sandbox was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuotaExceeded {
    /// Too many running sandboxes.
    #[error("quota max_sandboxes exceeded: {running} sandboxes are running and the limit is {limit}; delete one first")]
    Sandboxes {
        /// Running now.
        running: u64,
        /// The quota.
        limit: u64,
    },
    /// Too much memory reserved.
    #[error(
        "quota max_memory_bytes exceeded: running sandboxes reserve {used} bytes, this one asks for {asked} more and \
         the limit is {limit}; delete a sandbox or ask for less memory"
    )]
    Memory {
        /// Reserved by running sandboxes.
        used: u64,
        /// Asked for by the new sandbox.
        asked: u64,
        /// The quota.
        limit: u64,
    },
    /// Too many processes reserved.
    #[error(
        "quota max_pids exceeded: running sandboxes may have {used} processes, this one asks for {asked} more and the \
         limit is {limit}; delete a sandbox or ask for fewer pids"
    )]
    Pids {
        /// Reserved by running sandboxes.
        used: u64,
        /// Asked for by the new sandbox.
        asked: u64,
        /// The quota.
        limit: u64,
    },
    /// Too many bytes in the snapshot store.
    #[error(
        "quota max_snapshot_bytes exceeded: the tenant's snapshots take {used} bytes of the store, this one {asked} \
         more and the limit is {limit}; delete a snapshot first"
    )]
    SnapshotBytes {
        /// Taken by the tenant's snapshots.
        used: u64,
        /// Taken by the new one (0 when refused before it was taken).
        asked: u64,
        /// The quota.
        limit: u64,
    },
}

/// A command's row, written when it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRecord {
    /// `cmd-` + 16 hex digits.
    pub id: String,
    /// The sandbox it runs in.
    pub sandbox_id: String,
    /// The tenant that ran it.
    pub tenant: String,
    /// The resolved argv.
    pub argv: Vec<String>,
    /// Start time, ms since the Unix epoch.
    pub started_ms: i64,
}

/// A tenant as stored: the config says which tenants exist, the row remembers since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantRecord {
    /// The tenant's name.
    pub name: String,
    /// When a server start first found it in the config, ms since the Unix epoch.
    pub created_ms: i64,
    /// When a server start last found it in the config, ms since the Unix epoch (older than the latest start: the
    /// tenant was removed from the config; its row stays, as its sandboxes' rows do).
    pub last_seen_ms: i64,
    /// Its quota as of `last_seen_ms` (the config is what is enforced).
    pub quota: Quota,
}

/// Where a recorded command is (tests, diagnostics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandState {
    /// When it ended, ms since the Unix epoch; `None` while running.
    pub ended_ms: Option<i64>,
    /// Why it ended: `exited`, `timeout`, `unknown` (no exit status) or `lost` (found running at startup).
    pub end_reason: Option<String>,
}

/// The SQLite store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    /// `None` once `close` has run: the server stopped, and a task still running then gets `StoreError::Closed`.
    conn: Arc<Mutex<Option<Connection>>>,
    /// The keys secret values are sealed with (see `seal`).
    keys: Arc<SealKeys>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Store")
    }
}

/// The last column is the sandbox's pause snapshot, if any (a ready snapshot `for_pause` of it): one fact, kept with
/// the snapshot.
const SANDBOX_COLUMNS: &str = "id, tenant, state, spec_json, metadata_json, created_ms, expires_ms, ended_ms, \
     end_reason, isolation, paused_ms, lifecycle_json, isolation_json, (SELECT s.id FROM snapshots s WHERE s.for_pause = 1 \
     AND s.source_sandbox = sandboxes.id AND s.state = 'ready' ORDER BY s.created_ms DESC LIMIT 1)";

/// A sandbox row before its text columns are parsed.
struct SandboxRow {
    record: SandboxRecord,
    state: String,
    spec_json: String,
    metadata_json: String,
    isolation: String,
    lifecycle_json: String,
    isolation_json: String,
}

fn sandbox_from_row(row: &Row<'_>) -> rusqlite::Result<SandboxRow> {
    let record = SandboxRecord {
        id: row.get(0)?,
        tenant: row.get(1)?,
        state: SandboxState::Running,
        spec: SandboxSpec::default(),
        isolation: Isolation::default(),
        metadata: BTreeMap::new(),
        created_ms: row.get(5)?,
        expires_ms: row.get(6)?,
        ended_ms: row.get(7)?,
        end_reason: row.get(8)?,
        paused_ms: row.get(10)?,
        lifecycle: Lifecycle::default(),
        pause_snapshot: row.get(13)?,
    };
    Ok(SandboxRow {
        record,
        state: row.get(2)?,
        spec_json: row.get(3)?,
        metadata_json: row.get(4)?,
        isolation: row.get(9)?,
        lifecycle_json: row.get(11)?,
        isolation_json: row.get(12)?,
    })
}

/// The record of a row; its tier is the `isolation` column's (the one quotas, pools and reconcile may key on).
fn finish_sandbox(row: SandboxRow) -> Result<SandboxRecord, StoreError> {
    let SandboxRow { mut record, state, spec_json, metadata_json, isolation, lifecycle_json, isolation_json } = row;
    record.state = match SandboxState::parse(&state).ok_or(StoreError::UnknownState(state))? {
        SandboxState::Running if record.paused_ms.is_some() => SandboxState::Paused,
        stored => stored,
    };
    record.lifecycle = serde_json::from_str(&lifecycle_json)?;
    record.spec = serde_json::from_str(&spec_json)?;
    let tier = Tier::from_name(&isolation).ok_or(StoreError::UnknownTier(isolation))?;
    record.spec.isolation = Some(tier);
    record.isolation = match isolation_json.as_str() {
        "" => Isolation::new(tier, Isolation::REQUESTED),
        json => serde_json::from_str(json)?,
    };
    record.metadata = serde_json::from_str(&metadata_json)?;
    Ok(record)
}

fn query_sandboxes(
    conn: &Connection,
    sql_where: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<SandboxRecord>, StoreError> {
    let sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE {sql_where} ORDER BY created_ms, rowid");
    let mut statement = conn.prepare_cached(&sql)?;
    let rows = statement.query_map(params, sandbox_from_row)?;
    rows.map(|row| finish_sandbox(row?)).collect()
}

/// Whether `quota` has room for one more running sandbox of `tenant` asking for `(memory, pids)`, counting its
/// running sandboxes (paused ones take no room): the check of an admission and of a resume.
pub(crate) fn room_for(
    conn: &Connection,
    tenant: &str,
    (asked, asked_pids): (u64, u64),
    quota: Quota,
) -> Result<Result<(), QuotaExceeded>, StoreError> {
    let (running, used, used_pids): (i64, i64, i64) = conn.query_row(
        "SELECT COUNT(*), COALESCE(SUM(memory_bytes), 0), COALESCE(SUM(pids), 0) FROM sandboxes \
         WHERE tenant = ?1 AND state = 'running' AND paused_ms IS NULL",
        params![tenant],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )?;
    let [running, used, used_pids] = [running, used, used_pids].map(|n| n.max(0) as u64);
    if running >= quota.max_sandboxes {
        return Ok(Err(QuotaExceeded::Sandboxes { running, limit: quota.max_sandboxes }));
    }
    if used.saturating_add(asked) > quota.max_memory_bytes {
        return Ok(Err(QuotaExceeded::Memory { used, asked, limit: quota.max_memory_bytes }));
    }
    if used_pids.saturating_add(asked_pids) > quota.max_pids {
        return Ok(Err(QuotaExceeded::Pids { used: used_pids, asked: asked_pids, limit: quota.max_pids }));
    }
    Ok(Ok(()))
}

/// Makes a database return freed pages on request: `auto_vacuum = INCREMENTAL`, which an existing database only takes
/// after one full `VACUUM` (done once, at the first start of this version).
fn enable_incremental_vacuum(conn: &Connection) -> Result<(), StoreError> {
    let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |row| row.get(0))?;
    if mode != 2 {
        conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")?;
    }
    Ok(())
}

pub(crate) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Store {
    /// Opens (creating when missing) the database file, switches it to WAL and applies migrations; secret values are
    /// sealed with `keys`' current key, and those a previous key sealed are re-sealed now.
    pub fn open(path: &Path, keys: SealKeys) -> Result<Store, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(StoreError::Directory)?;
        }
        let conn = Connection::open(path)?;
        // Another server may still hold the file for a moment (a restart): wait for it rather than fail.
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        enable_incremental_vacuum(&conn)?;
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
        tracing::debug!(path = %path.display(), journal_mode = %mode, "database opened");
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        Self::prepare(conn, keys)
    }

    /// A private in-memory database (tests), its secrets sealed with a key of its own.
    pub fn open_in_memory() -> Result<Store, StoreError> {
        Self::prepare(Connection::open_in_memory()?, SealKeys::ephemeral()?)
    }

    fn prepare(mut conn: Connection, keys: SealKeys) -> Result<Store, StoreError> {
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // Deleted and overwritten content (a replaced secret's sealed value, the plaintext rows of older databases)
        // is zeroed rather than left in free space.
        conn.pragma_update(None, "secure_delete", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let sealed = migrations::migrate(&mut conn, &keys)?;
        let resealed = crate::seal::rows::reseal(&mut conn, &keys)?;
        if sealed + resealed > 0 {
            crate::seal::rows::scrub(&conn)?;
        }
        Ok(Store { conn: Arc::new(Mutex::new(Some(conn))), keys: Arc::new(keys) })
    }

    /// The keys secret values are sealed with.
    pub(crate) fn seal_keys(&self) -> &SealKeys {
        &self.keys
    }

    /// Runs `f` with the connection on the blocking thread pool.
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().map_err(|_| StoreError::Poisoned)?;
            f(guard.as_mut().ok_or(StoreError::Closed)?)
        })
        .await?
    }

    /// Closes the database now, whoever still holds a clone of this store: SQLite checkpoints the write-ahead log
    /// and removes its `-wal` and `-shm` files, so a stopped server leaves only the database file. Calls after this
    /// fail with `StoreError::Closed`.
    pub async fn close(&self) -> Result<(), StoreError> {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let taken = conn.lock().map_err(|_| StoreError::Poisoned)?.take();
            match taken {
                Some(connection) => connection.close().map_err(|(_, error)| StoreError::from(error)),
                None => Ok(()),
            }
        })
        .await?
    }

    /// Checks the tenant's quota and, when it admits the sandbox, inserts it as running, atomically.
    pub async fn admit_sandbox(
        &self,
        record: SandboxRecord,
        quota: Quota,
    ) -> Result<Result<(), QuotaExceeded>, StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let (asked, asked_pids) = (record.spec.limits.memory_bytes, record.spec.limits.pids);
            if let Err(exceeded) = room_for(&tx, &record.tenant, (asked, asked_pids), quota)? {
                return Ok(Err(exceeded));
            }
            tx.execute(
                "INSERT INTO sandboxes (id, tenant, state, spec_json, metadata_json, memory_bytes, created_ms, \
                 expires_ms, ended_ms, end_reason, isolation, pids, lifecycle_json, isolation_json) \
                 VALUES (?1, ?2, 'running', ?3, ?4, ?5, ?6, ?7, NULL, NULL, ?8, ?9, ?10, ?11)",
                params![
                    record.id,
                    record.tenant,
                    serde_json::to_string(&record.spec)?,
                    serde_json::to_string(&record.metadata)?,
                    to_i64(asked),
                    record.created_ms,
                    record.expires_ms,
                    record.spec.tier().name(),
                    to_i64(asked_pids),
                    serde_json::to_string(&record.lifecycle)?,
                    serde_json::to_string(&record.isolation)?,
                ],
            )?;
            tx.commit()?;
            Ok(Ok(()))
        })
        .await
    }

    /// Records how sandbox `id` is isolated (the runtime's word on a microVM's acceleration, after its create).
    pub async fn set_isolation(&self, id: &str, isolation: &Isolation) -> Result<(), StoreError> {
        let (id, json) = (id.to_owned(), serde_json::to_string(isolation)?);
        self.call(move |conn| {
            conn.execute("UPDATE sandboxes SET isolation_json = ?2 WHERE id = ?1", params![id, json])?;
            Ok(())
        })
        .await
    }

    /// Removes a sandbox row (and its commands) whose creation failed, so that nothing of it remains.
    pub async fn forget_sandbox(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.call(move |conn| {
            conn.execute("DELETE FROM sandboxes WHERE id = ?1", params![id])?;
            Ok(())
        })
        .await
    }

    /// The tenant's sandbox `id`, in any state; `None` when it does not exist or belongs to another tenant.
    pub async fn sandbox(&self, tenant: &str, id: &str) -> Result<Option<SandboxRecord>, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.call(move |conn| {
            let sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1 AND tenant = ?2");
            let row = conn.prepare_cached(&sql)?.query_row(params![id, tenant], sandbox_from_row).optional()?;
            row.map(finish_sandbox).transpose()
        })
        .await
    }

    /// The tenant's sandboxes, oldest first; only those in `state` when given.
    pub async fn sandboxes(&self, tenant: &str, state: Option<SandboxState>) -> Result<Vec<SandboxRecord>, StoreError> {
        let tenant = tenant.to_owned();
        self.call(move |conn| match state {
            Some(SandboxState::Running) => {
                query_sandboxes(conn, "tenant = ?1 AND state = 'running' AND paused_ms IS NULL", params![tenant])
            }
            Some(SandboxState::Paused) => {
                query_sandboxes(conn, "tenant = ?1 AND state = 'running' AND paused_ms IS NOT NULL", params![tenant])
            }
            Some(state) => query_sandboxes(conn, "tenant = ?1 AND state = ?2", params![tenant, state.as_str()]),
            None => query_sandboxes(conn, "tenant = ?1", params![tenant]),
        })
        .await
    }

    /// Every running (or paused) sandbox of every tenant (the startup reconcile checks each against the runtime).
    pub async fn running_sandboxes(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        self.call(|conn| query_sandboxes(conn, "state = 'running'", [])).await
    }

    /// Number of running sandboxes, all tenants.
    pub async fn count_running(&self) -> Result<u64, StoreError> {
        self.call(|conn| {
            let count: i64 =
                conn.query_row("SELECT COUNT(*) FROM sandboxes WHERE state = 'running'", [], |row| row.get(0))?;
            Ok(count.max(0) as u64)
        })
        .await
    }

    /// Running (not paused) sandboxes whose expiry is at or before `now_ms`.
    pub async fn expired_sandboxes(&self, now_ms: i64) -> Result<Vec<SandboxRecord>, StoreError> {
        self.call(move |conn| {
            query_sandboxes(conn, "state = 'running' AND paused_ms IS NULL AND expires_ms <= ?1", params![now_ms])
        })
        .await
    }

    /// Sets a running sandbox's expiry; false when it is not the tenant's or not running.
    pub async fn set_expiry(&self, tenant: &str, id: &str, expires_ms: i64) -> Result<bool, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.call(move |conn| {
            let changed = conn.execute(
                "UPDATE sandboxes SET expires_ms = ?3 WHERE id = ?1 AND tenant = ?2 AND state = 'running'",
                params![id, tenant, expires_ms],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    /// Moves a running (or paused) sandbox to `state` (destroyed, lost, expired); false when it was no longer running.
    pub async fn end_sandbox(
        &self,
        id: &str,
        state: SandboxState,
        reason: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let (id, reason) = (id.to_owned(), reason.to_owned());
        self.call(move |conn| {
            let changed = conn.execute(
                "UPDATE sandboxes SET state = ?2, ended_ms = ?3, end_reason = ?4 WHERE id = ?1 AND state = 'running'",
                params![id, state.as_str(), now_ms, reason],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    /// Marks a running sandbox lost (its processes died outside the server's control).
    pub async fn mark_lost(&self, id: &str, reason: &str) -> Result<bool, StoreError> {
        self.end_sandbox(id, SandboxState::Lost, reason, crate::clock::now_ms()).await
    }

    /// Records a command as started.
    pub async fn start_command(&self, command: CommandRecord) -> Result<(), StoreError> {
        self.call(move |conn| {
            conn.execute(
                "INSERT INTO commands (id, sandbox_id, tenant, argv_json, started_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    command.id,
                    command.sandbox_id,
                    command.tenant,
                    serde_json::to_string(&command.argv)?,
                    command.started_ms
                ],
            )?;
            Ok(())
        })
        .await
    }

    /// Records how a command ended (`None`: the runtime failed and there is no exit status).
    pub async fn finish_command(&self, id: &str, exit: Option<CommandExit>, now_ms: i64) -> Result<(), StoreError> {
        let id = id.to_owned();
        let reason = match exit {
            Some(exit) if exit.timed_out => "timeout",
            Some(_) => "exited",
            None => "unknown",
        };
        self.call(move |conn| {
            conn.execute(
                "UPDATE commands SET ended_ms = ?2, exit_code = ?3, signal = ?4, timed_out = ?5, end_reason = ?6 \
                 WHERE id = ?1",
                params![
                    id,
                    now_ms,
                    exit.and_then(|e| e.exit_code),
                    exit.and_then(|e| e.signal),
                    exit.map(|e| i64::from(e.timed_out)),
                    reason
                ],
            )?;
            Ok(())
        })
        .await
    }

    /// Marks every command still recorded as running ended at `now_ms` with reason `lost` (the startup reconcile:
    /// the server that watched them is gone); returns how many.
    pub async fn mark_running_commands_lost(&self, now_ms: i64) -> Result<usize, StoreError> {
        self.call(move |conn| {
            let changed = conn.execute(
                "UPDATE commands SET ended_ms = ?1, end_reason = 'lost' WHERE ended_ms IS NULL",
                params![now_ms],
            )?;
            Ok(changed)
        })
        .await
    }

    /// Where command `id` is; `None` when there is no such row.
    pub async fn command_state(&self, id: &str) -> Result<Option<CommandState>, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| {
            let row = conn
                .query_row("SELECT ended_ms, end_reason FROM commands WHERE id = ?1", params![id], |row| {
                    Ok(CommandState { ended_ms: row.get(0)?, end_reason: row.get(1)? })
                })
                .optional()?;
            Ok(row)
        })
        .await
    }

    /// Records the config's tenants at a server start: new ones are inserted (created now), known ones get their
    /// quota and `last_seen_ms` updated. Tenants no longer in the config keep their rows.
    pub async fn upsert_tenants(&self, tenants: Vec<(String, Quota)>, now_ms: i64) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction()?;
            {
                let mut statement = tx.prepare_cached(
                    "INSERT INTO tenants (name, created_ms, last_seen_ms, max_sandboxes, max_memory_bytes, max_pids, \
                     max_output_bytes, max_snapshot_bytes) VALUES (?1, ?2, ?2, ?3, ?4, ?5, ?6, ?7) \
                     ON CONFLICT (name) DO UPDATE SET \
                     last_seen_ms = excluded.last_seen_ms, max_sandboxes = excluded.max_sandboxes, \
                     max_memory_bytes = excluded.max_memory_bytes, max_pids = excluded.max_pids, \
                     max_output_bytes = excluded.max_output_bytes, max_snapshot_bytes = excluded.max_snapshot_bytes",
                )?;
                for (name, quota) in &tenants {
                    statement.execute(params![
                        name,
                        now_ms,
                        to_i64(quota.max_sandboxes),
                        to_i64(quota.max_memory_bytes),
                        to_i64(quota.max_pids),
                        to_i64(quota.max_output_bytes),
                        to_i64(quota.max_snapshot_bytes)
                    ])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Every tenant ever recorded, by name.
    pub async fn tenants(&self) -> Result<Vec<TenantRecord>, StoreError> {
        self.call(|conn| {
            let mut statement = conn.prepare_cached(
                "SELECT name, created_ms, last_seen_ms, max_sandboxes, max_memory_bytes, max_pids, max_output_bytes, \
                 max_snapshot_bytes FROM tenants ORDER BY name",
            )?;
            let rows = statement.query_map([], |row| {
                let (max_sandboxes, max_memory_bytes, max_pids, max_output_bytes): (i64, i64, i64, i64) =
                    (row.get(3)?, row.get(4)?, row.get(5)?, row.get(6)?);
                Ok(TenantRecord {
                    name: row.get(0)?,
                    created_ms: row.get(1)?,
                    last_seen_ms: row.get(2)?,
                    quota: Quota {
                        max_sandboxes: max_sandboxes.max(0) as u64,
                        max_memory_bytes: max_memory_bytes.max(0) as u64,
                        max_pids: max_pids.max(0) as u64,
                        max_output_bytes: max_output_bytes.max(0) as u64,
                        max_snapshot_bytes: row.get::<_, i64>(7)?.max(0) as u64,
                    },
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Number of commands recorded for a sandbox (tests, diagnostics).
    pub async fn command_count(&self, sandbox_id: &str) -> Result<u64, StoreError> {
        let id = sandbox_id.to_owned();
        self.call(move |conn| {
            let count: i64 =
                conn.query_row("SELECT COUNT(*) FROM commands WHERE sandbox_id = ?1", params![id], |row| row.get(0))?;
            Ok(count.max(0) as u64)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, tenant: &str, memory: u64) -> SandboxRecord {
        let mut spec = SandboxSpec { isolation: Some(Tier::Process), ..SandboxSpec::default() };
        spec.limits.memory_bytes = memory;
        SandboxRecord {
            id: id.into(),
            tenant: tenant.into(),
            state: SandboxState::Running,
            spec,
            isolation: sandkasten_types::Isolation::new(Tier::Process, "requested"),
            metadata: BTreeMap::from([("k".into(), "v".into())]),
            created_ms: 1,
            expires_ms: 100,
            ended_ms: None,
            end_reason: None,
            paused_ms: None,
            pause_snapshot: None,
            lifecycle: Default::default(),
        }
    }

    const QUOTA: Quota =
        Quota { max_sandboxes: 2, max_memory_bytes: 300, max_pids: 1000, max_output_bytes: 1, max_snapshot_bytes: 1 };

    #[tokio::test]
    async fn a_paused_sandbox_leaves_the_quota_its_clock_stops_and_a_resume_is_admitted_like_a_create()
    -> Result<(), StoreError> {
        let store = Store::open_in_memory()?;
        assert_eq!(store.admit_sandbox(record("a", "t1", 100), QUOTA).await?, Ok(()));
        assert_eq!(store.admit_sandbox(record("b", "t1", 100), QUOTA).await?, Ok(()));
        assert!(store.pause_sandbox("a", 40).await?);
        assert!(!store.pause_sandbox("a", 41).await?, "paused already");
        assert_eq!(store.sandbox("t1", "a").await?.map(|r| r.state), Some(SandboxState::Paused));
        assert_eq!(store.expired_sandboxes(1000).await?.len(), 1, "only b expires: a's clock stands still");
        assert_eq!(store.admit_sandbox(record("c", "t1", 100), QUOTA).await?, Ok(()), "a paused one takes no room");
        let at = |now_ms| (now_ms, 1000);
        assert!(matches!(store.resume_sandbox("t1", "a", QUOTA, at(90)).await?, Err(QuotaExceeded::Sandboxes { .. })));
        assert!(store.end_sandbox("c", SandboxState::Destroyed, "deleted", 91).await?);
        assert_eq!(store.resume_sandbox("t1", "a", QUOTA, at(90)).await?, Ok(true));
        let a = store.sandbox("t1", "a").await?.map(|a| (a.state, a.expires_ms, a.paused_ms));
        assert_eq!(a, Some((SandboxState::Running, 150, None)), "its expiry moved on by the 50 ms it was paused");
        assert_eq!(store.resume_sandbox("t1", "a", QUOTA, at(95)).await?, Ok(false), "not paused");
        // Paused at (after) its timeout, as auto_pause does: the renewal from now.
        assert!(store.pause_sandbox("a", 200).await?);
        assert_eq!(store.resume_sandbox("t1", "a", QUOTA, at(300)).await?, Ok(true));
        assert_eq!(store.sandbox("t1", "a").await?.map(|a| a.expires_ms), Some(1300));
        Ok(())
    }

    #[tokio::test]
    async fn quota_counts_only_the_tenants_running_sandboxes() -> Result<(), StoreError> {
        let store = Store::open_in_memory()?;
        assert_eq!(store.admit_sandbox(record("a", "t1", 100), QUOTA).await?, Ok(()));
        assert_eq!(store.admit_sandbox(record("b", "t1", 100), QUOTA).await?, Ok(()));
        assert!(matches!(
            store.admit_sandbox(record("c", "t1", 1), QUOTA).await?,
            Err(QuotaExceeded::Sandboxes { .. })
        ));
        assert_eq!(store.admit_sandbox(record("d", "t2", 100), QUOTA).await?, Ok(()));
        assert!(store.end_sandbox("a", SandboxState::Destroyed, "deleted", 5).await?);
        assert!(!store.end_sandbox("a", SandboxState::Destroyed, "deleted", 5).await?);
        assert!(matches!(store.admit_sandbox(record("e", "t1", 250), QUOTA).await?, Err(QuotaExceeded::Memory { .. })));
        assert_eq!(store.admit_sandbox(record("e", "t1", 200), QUOTA).await?, Ok(()));
        Ok(())
    }

    #[tokio::test]
    async fn the_pids_quota_sums_the_running_sandboxes_pids_limits() -> Result<(), StoreError> {
        let store = Store::open_in_memory()?;
        let quota = Quota {
            max_sandboxes: 10,
            max_memory_bytes: u64::MAX,
            max_pids: 1000,
            max_output_bytes: 1,
            max_snapshot_bytes: 1,
        };
        let with_pids = |id: &str, tenant: &str, pids: u64| {
            let mut record = record(id, tenant, 1);
            record.spec.limits.pids = pids;
            record
        };
        assert_eq!(store.admit_sandbox(with_pids("a", "t1", 600), quota).await?, Ok(()));
        let refused = store.admit_sandbox(with_pids("b", "t1", 500), quota).await?;
        assert_eq!(refused, Err(QuotaExceeded::Pids { used: 600, asked: 500, limit: 1000 }));
        assert!(refused.err().map(|e| e.to_string()).unwrap_or_default().contains("max_pids"));
        assert_eq!(store.admit_sandbox(with_pids("c", "t2", 900), quota).await?, Ok(()), "another tenant's share");
        assert!(store.end_sandbox("a", SandboxState::Destroyed, "deleted", 5).await?);
        assert_eq!(store.admit_sandbox(with_pids("b", "t1", 500), quota).await?, Ok(()), "freed by the end");
        Ok(())
    }

    #[tokio::test]
    async fn the_tier_is_stored_and_every_tier_counts_against_one_quota() -> Result<(), Box<dyn std::error::Error>> {
        let store = Store::open_in_memory()?;
        let mut strong = record("g", "t1", 100);
        strong.spec.isolation = Some(Tier::Gvisor);
        store.admit_sandbox(strong.clone(), QUOTA).await??;
        assert_eq!(store.sandbox("t1", "g").await?, Some(strong));
        let mut unset = record("p", "t1", 100);
        unset.spec.isolation = None;
        store.admit_sandbox(unset, QUOTA).await??;
        let read = store.sandbox("t1", "p").await?.map(|r| r.spec.isolation);
        assert_eq!(read, Some(Some(Tier::Process)), "an unset tier is recorded as process");
        assert!(matches!(
            store.admit_sandbox(record("x", "t1", 1), QUOTA).await?,
            Err(QuotaExceeded::Sandboxes { running: 2, .. })
        ));
        Ok(())
    }

    #[tokio::test]
    async fn records_round_trip_and_stay_with_their_tenant() -> Result<(), StoreError> {
        let store = Store::open_in_memory()?;
        let original = record("a", "t1", 100);
        store.admit_sandbox(original.clone(), QUOTA).await?.ok();
        assert_eq!(store.sandbox("t1", "a").await?, Some(original));
        assert_eq!(store.sandbox("t2", "a").await?, None);
        assert!(!store.set_expiry("t2", "a", 500).await?);
        assert!(store.set_expiry("t1", "a", 500).await?);
        assert_eq!(store.expired_sandboxes(499).await?, Vec::new());
        let expired = store.expired_sandboxes(500).await?;
        assert_eq!(
            expired.iter().map(|r| (r.id.as_str(), r.lifecycle)).collect::<Vec<_>>(),
            [("a", Lifecycle::default())]
        );
        assert!(store.mark_lost("a", "gone").await?);
        assert_eq!(store.running_sandboxes().await?.len(), 0);
        assert_eq!(store.sandboxes("t1", Some(SandboxState::Lost)).await?.len(), 1);
        Ok(())
    }

    #[tokio::test]
    async fn commands_are_recorded_and_forgotten_with_their_sandbox() -> Result<(), StoreError> {
        let store = Store::open_in_memory()?;
        store.admit_sandbox(record("a", "t1", 100), QUOTA).await?.ok();
        let command = CommandRecord {
            id: "cmd-1".into(),
            sandbox_id: "a".into(),
            tenant: "t1".into(),
            argv: vec!["echo".into()],
            started_ms: 3,
        };
        store.start_command(command).await?;
        store.finish_command("cmd-1", Some(CommandExit { exit_code: Some(0), ..CommandExit::default() }), 4).await?;
        assert_eq!(store.command_count("a").await?, 1);
        store.forget_sandbox("a").await?;
        assert_eq!(store.command_count("a").await?, 0);
        assert_eq!(store.sandbox("t1", "a").await?, None);
        Ok(())
    }

    fn command(id: &str, sandbox: &str) -> CommandRecord {
        CommandRecord {
            id: id.into(),
            sandbox_id: sandbox.into(),
            tenant: "t1".into(),
            argv: vec!["sleep".into(), "100".into()],
            started_ms: 3,
        }
    }

    #[tokio::test]
    async fn commands_left_running_by_a_crash_are_marked_lost_after_reopen() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sandkasten.db");
        {
            let store = Store::open(&path, SealKeys::ephemeral()?)?;
            store.admit_sandbox(record("a", "t1", 1), QUOTA).await??;
            store.start_command(command("cmd-running", "a")).await?;
            store.start_command(command("cmd-done", "a")).await?;
            let timed_out = CommandExit { signal: Some(9), timed_out: true, ..CommandExit::default() };
            store.finish_command("cmd-done", Some(timed_out), 4).await?;
            // The server dies here: nothing records the end of cmd-running.
        }
        let store = Store::open(&path, SealKeys::ephemeral()?)?;
        assert_eq!(store.mark_running_commands_lost(50).await?, 1);
        assert_eq!(
            store.command_state("cmd-running").await?,
            Some(CommandState { ended_ms: Some(50), end_reason: Some("lost".into()) })
        );
        assert_eq!(
            store.command_state("cmd-done").await?,
            Some(CommandState { ended_ms: Some(4), end_reason: Some("timeout".into()) })
        );
        assert_eq!(store.mark_running_commands_lost(60).await?, 0);
        assert_eq!(store.command_state("cmd-missing").await?, None);
        Ok(())
    }

    #[tokio::test]
    async fn tenants_are_upserted_and_keep_their_creation_time() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sandkasten.db");
        let small =
            Quota { max_sandboxes: 1, max_memory_bytes: 10, max_pids: 5, max_output_bytes: 7, max_snapshot_bytes: 9 };
        let store = Store::open(&path, SealKeys::ephemeral()?)?;
        store.upsert_tenants(vec![("t1".into(), QUOTA), ("t2".into(), QUOTA)], 10).await?;
        drop(store);
        let store = Store::open(&path, SealKeys::ephemeral()?)?;
        store.upsert_tenants(vec![("t1".into(), small), ("t3".into(), QUOTA)], 20).await?;
        let tenants = store.tenants().await?;
        let expected = [("t1", 10, 20, small), ("t2", 10, 10, QUOTA), ("t3", 20, 20, QUOTA)];
        assert_eq!(tenants.len(), expected.len());
        for (tenant, (name, created, seen, quota)) in tenants.iter().zip(expected) {
            assert_eq!(
                tenant,
                &TenantRecord { name: name.into(), created_ms: created, last_seen_ms: seen, quota },
                "{tenant:?}"
            );
        }
        Ok(())
    }

    #[tokio::test]
    async fn file_database_uses_wal_and_survives_reopen() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("nested/sandkasten.db");
        Store::open(&path, SealKeys::ephemeral()?)?.admit_sandbox(record("a", "t1", 1), QUOTA).await??;
        let store = Store::open(&path, SealKeys::ephemeral()?)?;
        assert_eq!(store.running_sandboxes().await?.len(), 1);
        let mode: String = Connection::open(&path)?.query_row("PRAGMA journal_mode", [], |row| row.get(0))?;
        assert_eq!(mode, "wal");
        Ok(())
    }
}
