//! Egress for `sandkasten serve`: one proxy (crate `sandkasten-egress`) for every sandbox, and per sandbox a door
//! into it — a listener on `127.0.0.1:3128` inside the sandbox's network namespace, opened while its policy lets
//! anything out and closed (with every tunnel through it) when the policy becomes `none` or the sandbox goes.
//!
//! - [`prepare`] checks a spec's policy and turns its secret names into placeholders (before the sandbox exists);
//! - [`Egress::attach`] opens the door of a created sandbox, [`Egress::set_policy`] changes it live,
//!   [`Egress::detach`] closes it;
//! - `audit` writes every attempt to the store and the metrics; `store` holds secrets, audit and policy changes.

pub mod audit;
pub mod rules;
pub mod store;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use sandkasten_egress::{Mode, Policy, Proxy, ProxyHandle, SandboxCa, SandboxEgress, Secret};
use sandkasten_types::{Failure, FailureKind, HeaderRule, NetworkMode, NetworkPolicy, PROXY_PORT, SandboxSpec};

use self::rules::{RuleError, RuleSecret};

use crate::ids::IdError;
use crate::store::{Store, StoreError};
use sandkasten_runtime::SandboxRuntime;

/// The variables pointing TLS clients at the interception CA's bundle in a sandbox with secrets (curl, Python,
/// pip, git, Node).
pub(crate) const CA_BUNDLE_VARIABLES: [&str; 6] =
    ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS"];

/// Where a sandbox that holds secrets finds the CA bundle trusting its interception CA (the system's roots plus it).
pub const CA_BUNDLE_PATH: &str = "/tmp/.sandkasten-ca-bundle.pem";
/// Where distributions keep the system's CA bundle (Debian/Ubuntu, Fedora/RHEL, openSUSE, Alpine); the first that
/// exists is the base of a sandbox's bundle.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Compiles a spec's network policy; the error names the bad pattern and says how to fix it.
pub fn compile(policy: &NetworkPolicy) -> Result<Policy, String> {
    let mode = match policy.mode {
        NetworkMode::None => Mode::None,
        NetworkMode::Allowlist => Mode::Allowlist,
        NetworkMode::Open => Mode::Open,
    };
    if policy.mode == NetworkMode::None && !(policy.allow.is_empty() && policy.deny.is_empty()) {
        return Err("network mode \"none\" takes no allow or deny patterns: use mode \"allowlist\"".to_owned());
    }
    if policy.mode == NetworkMode::Open && !policy.allow.is_empty() {
        return Err(
            "network mode \"open\" allows every public host already: drop \"allow\", or use \"allowlist\"".to_owned()
        );
    }
    Policy::compile(mode, &policy.allow, &policy.deny).map_err(|error| format!("network: {error}"))
}

/// Why [`prepare`] refused a spec (the API answers each as `api::error` maps it).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The network policy does not compile (400); the message names the bad pattern.
    #[error("{0}")]
    Policy(String),
    /// A named secret does not exist for the tenant (422).
    #[error("secret {0:?} does not exist for this tenant: create it with PUT /v1/secrets/{0}")]
    UnknownSecret(String),
    /// A named secret has no hosts (made through E2B's secrets API): its placeholder could go nowhere (422).
    #[error(
        "secret {0:?} has no hosts to send it to (it was made through E2B's secrets API): use it in a header rule \
         (${{secrets.{0}}}), or give it hosts with PUT /v1/secrets/{0}"
    )]
    HostlessSecret(String),
    /// A header rule is malformed or names an unknown secret (400).
    #[error(transparent)]
    Rules(#[from] RuleError),
    /// The sandbox's interception CA could not be made (500).
    #[error("sandbox CA: {0}")]
    Ca(String),
    /// The secrets could not be read (500).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No randomness for a placeholder (500).
    #[error(transparent)]
    Id(#[from] IdError),
}

/// What a sandbox's egress needs once it exists: its compiled policy, its secrets with their placeholders, and the CA
/// that intercepts TLS toward the secrets' hosts.
pub struct Prepared {
    policy: Policy,
    secrets: Vec<Secret>,
    rules: Rules,
    ca: Option<SandboxCa>,
}

/// A sandbox's header rules as given, with the secrets they name (to resolve them again when one changes).
#[derive(Debug, Default, Clone)]
pub struct Rules {
    rules: Vec<HeaderRule>,
    secrets: BTreeMap<String, RuleSecret>,
}

impl Rules {
    /// Checks `rules` against `policy` and reads the secrets they name (each must exist for the tenant).
    pub async fn load(
        store: &Store,
        tenant: &str,
        rules: &[HeaderRule],
        policy: &Policy,
    ) -> Result<Rules, PrepareError> {
        rules::check(rules, policy)?;
        if rules.is_empty() {
            return Ok(Rules::default());
        }
        let mut names = Vec::new();
        for rule in rules {
            names.extend(rules::referenced(&rule.value)?);
        }
        let secrets = store
            .secrets(tenant)
            .await?
            .into_iter()
            .filter(|stored| names.contains(&stored.name))
            .map(|stored| (stored.name, RuleSecret { value: stored.value, hosts: stored.hosts }))
            .collect();
        let loaded = Rules { rules: rules.to_vec(), secrets };
        loaded.resolve(true)?;
        Ok(loaded)
    }

    fn resolve(&self, strict: bool) -> Result<Vec<Secret>, RuleError> {
        rules::resolve(&self.rules, &self.secrets, strict)
    }

    /// The hosts the rules send to.
    pub fn hosts(&self) -> Vec<String> {
        self.rules.iter().map(|rule| rule.host.clone()).collect()
    }
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").field("secrets", &self.secrets.len()).finish_non_exhaustive()
    }
}

/// Checks `spec`'s policy and resolves its secrets: each named secret must exist for the tenant; its environment
/// variable gets a fresh placeholder, and the CA variables point at [`CA_BUNDLE_PATH`]. Runs before the sandbox is
/// created (the environment is fixed at creation).
pub async fn prepare(store: &Store, tenant: &str, spec: &mut SandboxSpec) -> Result<Prepared, PrepareError> {
    let policy = compile(&spec.network).map_err(PrepareError::Policy)?;
    let rules = Rules::load(store, tenant, &spec.network.headers, &policy).await?;
    if spec.secrets.is_empty() && rules.rules.is_empty() {
        return Ok(Prepared { policy, secrets: Vec::new(), rules, ca: None });
    }
    let stored = store.secrets(tenant).await?;
    let mut secrets = Vec::new();
    for name in &spec.secrets {
        let Some(found) = stored.iter().find(|s| &s.name == name) else {
            return Err(PrepareError::UnknownSecret(name.clone()));
        };
        if found.hosts.is_empty() {
            return Err(PrepareError::HostlessSecret(name.clone()));
        }
        let placeholder = placeholder(name)?;
        spec.env.insert(name.clone(), placeholder.clone());
        secrets.push(Secret {
            name: name.clone(),
            value: found.value.clone(),
            placeholder,
            hosts: found.hosts.clone(),
            header: None,
        });
    }
    // The CA may vouch only for the hosts its secrets name now (name constraints): a host added to a secret later is
    // not intercepted in this sandbox (its tunnels stay blind, its value stays home).
    // The header rules' hosts likewise: a rule on a host not named at creation is refused by `Egress::set_rules`.
    let mut hosts: Vec<String> = secrets.iter().flat_map(|secret| secret.hosts.iter().cloned()).collect();
    hosts.extend(rules.hosts());
    let ca = SandboxCa::generate("sandkasten sandbox", &hosts).map_err(|e| PrepareError::Ca(e.to_string()))?;
    for name in CA_BUNDLE_VARIABLES {
        spec.env.insert(name.to_owned(), CA_BUNDLE_PATH.to_owned());
    }
    Ok(Prepared { policy, secrets, rules, ca: Some(ca) })
}

/// A placeholder for a secret: recognisable in logs, random so that one sandbox's placeholder means nothing to
/// another's proxy state.
fn placeholder(name: &str) -> Result<String, IdError> {
    let hex = crate::ids::random_hex(12)?;
    Ok(format!("sandkasten-secret-{}-{hex}", name.to_ascii_lowercase()))
}

struct Attached {
    tenant: String,
    sandbox: Arc<SandboxEgress>,
    /// The secrets the sandbox holds (the proxy's copy is replaced as a whole when one changes).
    secrets: Vec<Secret>,
    /// Its header rules and the secrets they name.
    rules: Rules,
    /// The hosts its CA vouches for (named at creation): the only hosts a header rule may have.
    ca_hosts: Vec<String>,
    door: Option<ProxyHandle>,
}

impl Attached {
    /// The proxy's secrets: the placeholders' and the header rules' (a rule whose secret is gone is left out).
    fn all_secrets(&self) -> Result<Vec<Secret>, RuleError> {
        let mut all = self.secrets.clone();
        all.extend(self.rules.resolve(false)?);
        Ok(all)
    }

    fn push_secrets(&self) {
        let pushed = self
            .all_secrets()
            .map_err(|e| e.to_string())
            .and_then(|all| self.sandbox.set_secrets(all).map_err(|e| e.to_string()));
        if let Err(error) = pushed {
            tracing::error!(%error, "egress secrets rejected");
        }
    }
}

fn reaches_out(policy: &Policy) -> bool {
    policy.mode() != Mode::None
}

/// The proxy and the sandboxes attached to it.
pub struct Egress {
    proxy: Proxy,
    /// The system's CA bundle (PEM), read once; `None` when the host has none at a known place.
    system_bundle: Option<Vec<u8>>,
    attached: Mutex<HashMap<String, Attached>>,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress").finish_non_exhaustive()
    }
}

fn poisoned() -> Failure {
    Failure::new(FailureKind::Internal, "egress table lock poisoned")
}

impl Egress {
    /// Egress through `proxy`.
    pub fn new(proxy: Proxy) -> Egress {
        let system_bundle = SYSTEM_BUNDLES.iter().find_map(|path| std::fs::read(path).ok());
        if system_bundle.is_none() {
            tracing::warn!(
                tried = ?SYSTEM_BUNDLES,
                "no system CA bundle found: sandboxes with secrets cannot be created (their HTTPS clients need one)"
            );
        }
        Egress { proxy, system_bundle, attached: Mutex::new(HashMap::new()) }
    }

    /// Attaches a created sandbox: writes its CA bundle when it holds secrets, and opens its door when the policy
    /// lets anything out.
    pub(crate) async fn attach(
        &self,
        runtime: &dyn SandboxRuntime,
        id: &str,
        tenant: &str,
        prepared: Prepared,
    ) -> Result<(), Failure> {
        if let Some(ca) = &prepared.ca {
            // Without the system's roots the bundle would trust only the sandbox CA, and every HTTPS client inside
            // (pointed at it by SSL_CERT_FILE and friends) would fail against any host but the secrets' ones.
            let mut bundle = self.system_bundle.clone().ok_or_else(|| {
                Failure::new(
                    FailureKind::Internal,
                    format!(
                        "the host has no system CA bundle (looked at {}); secrets need one",
                        SYSTEM_BUNDLES.join(", ")
                    ),
                )
            })?;
            bundle.extend_from_slice(b"\n");
            bundle.extend_from_slice(ca.cert_pem().as_bytes());
            runtime.write_file(id, CA_BUNDLE_PATH, bundle).await?;
        }
        let opens = reaches_out(&prepared.policy);
        let ca_hosts = if prepared.ca.is_some() {
            let mut hosts: Vec<String> = prepared.secrets.iter().flat_map(|s| s.hosts.iter().cloned()).collect();
            hosts.extend(prepared.rules.hosts());
            hosts
        } else {
            Vec::new()
        };
        let sandbox = Arc::new(SandboxEgress::new(id, tenant, prepared.policy, prepared.ca));
        let mut entry = Attached {
            tenant: tenant.to_owned(),
            sandbox,
            secrets: prepared.secrets,
            rules: prepared.rules,
            ca_hosts,
            door: None,
        };
        let all = entry.all_secrets().map_err(|e| Failure::new(FailureKind::Internal, format!("egress rules: {e}")))?;
        entry
            .sandbox
            .set_secrets(all)
            .map_err(|e| Failure::new(FailureKind::Internal, format!("egress secrets: {e}")))?;
        if opens {
            entry.door = Some(self.open_door(runtime, id, &entry.sandbox)?);
        }
        self.attached.lock().map_err(|_| poisoned())?.insert(id.to_owned(), entry);
        // A destroy that ran while the door was being opened found nothing to detach: the door must not outlive it.
        if !runtime.is_alive(id) {
            self.detach(id);
            return Err(Failure::new(FailureKind::SandboxGone, format!("sandbox {id} ended while starting")));
        }
        Ok(())
    }

    fn open_door(
        &self,
        runtime: &dyn SandboxRuntime,
        id: &str,
        sandbox: &Arc<SandboxEgress>,
    ) -> Result<ProxyHandle, Failure> {
        let entrance = runtime.listen_in_sandbox(id, PROXY_PORT)?;
        self.proxy
            .serve_at(entrance, Arc::clone(sandbox))
            .map_err(|e| Failure::new(FailureKind::Internal, format!("egress listener: {e}")))
    }

    /// Changes a live sandbox's policy: takes effect for new connections at once; a policy of `none` closes the door
    /// and every open tunnel. `NotFound` when the sandbox is not attached.
    pub(crate) fn set_policy(&self, runtime: &dyn SandboxRuntime, id: &str, policy: Policy) -> Result<(), Failure> {
        let mut attached = self.attached.lock().map_err(|_| poisoned())?;
        let entry = attached
            .get_mut(id)
            .ok_or_else(|| Failure::new(FailureKind::NotFound, format!("sandbox {id} has no egress state")))?;
        let opens = reaches_out(&policy);
        let previous = entry.sandbox.policy();
        entry.sandbox.set_policy(policy);
        match (opens, entry.door.is_some()) {
            (true, false) => match self.open_door(runtime, id, &entry.sandbox) {
                Ok(door) => entry.door = Some(door),
                Err(failure) => {
                    // Nothing changes when the door cannot open (e.g. code inside holds the port).
                    entry.sandbox.set_policy((*previous).clone());
                    return Err(failure);
                }
            },
            (false, true) => entry.door = None,
            _ => {}
        }
        Ok(())
    }

    /// Whether the sandbox's CA vouches for every host of `rules` (header rules need TLS interception there); the
    /// message names the first that is not. `NotFound` when the sandbox is not attached.
    pub(crate) fn check_rule_hosts(&self, id: &str, rules: &Rules) -> Result<Result<(), String>, Failure> {
        let attached = self.attached.lock().map_err(|_| poisoned())?;
        let entry = attached
            .get(id)
            .ok_or_else(|| Failure::new(FailureKind::NotFound, format!("sandbox {id} has no egress state")))?;
        Ok(match rules.hosts().into_iter().find(|host| !entry.ca_hosts.contains(host)) {
            None => Ok(()),
            Some(host) => Err(format!(
                "a header rule on {host:?} needs the sandbox's interception CA to vouch for that host, and it \
                 vouches only for the hosts of the secrets and header rules given when the sandbox was created \
                 ({:?}): create the sandbox with that rule",
                entry.ca_hosts
            )),
        })
    }

    /// Replaces a live sandbox's header rules (checked with [`Egress::check_rule_hosts`] first).
    pub(crate) fn set_rules(&self, id: &str, rules: Rules) -> Result<(), Failure> {
        let mut attached = self.attached.lock().map_err(|_| poisoned())?;
        let entry = attached
            .get_mut(id)
            .ok_or_else(|| Failure::new(FailureKind::NotFound, format!("sandbox {id} has no egress state")))?;
        entry.rules = rules;
        entry.push_secrets();
        Ok(())
    }

    /// A secret's value or hosts changed: every attached sandbox of the tenant that holds it uses the new ones.
    pub(crate) fn update_secret(&self, tenant: &str, name: &str, value: &str, hosts: &[String]) {
        let Ok(mut attached) = self.attached.lock() else { return };
        for entry in attached.values_mut().filter(|entry| entry.tenant == tenant) {
            let mut changed = false;
            if let Some(secret) = entry.rules.secrets.get_mut(name) {
                *secret = RuleSecret { value: value.to_owned(), hosts: hosts.to_vec() };
                changed = true;
            }
            for secret in entry.secrets.iter_mut().filter(|secret| secret.name == name) {
                secret.value = value.to_owned();
                secret.hosts = hosts.to_vec();
                changed = true;
            }
            if changed {
                entry.push_secrets();
            }
        }
    }

    /// A secret was deleted: no attached sandbox of the tenant gets its value any more.
    pub(crate) fn remove_secret(&self, tenant: &str, name: &str) {
        let Ok(mut attached) = self.attached.lock() else { return };
        for entry in attached.values_mut().filter(|entry| entry.tenant == tenant) {
            let before = entry.secrets.len();
            entry.secrets.retain(|secret| secret.name != name);
            let in_rules = entry.rules.secrets.remove(name).is_some();
            if entry.secrets.len() != before || in_rules {
                entry.push_secrets();
            }
        }
    }

    /// Closes a sandbox's door and forgets it (its tunnels end); unknown ids are ignored.
    pub(crate) fn detach(&self, id: &str) {
        if let Ok(mut attached) = self.attached.lock() {
            attached.remove(id);
        }
    }

    /// How many sandboxes have an open door (for the leak checks of tests).
    pub fn open_doors(&self) -> usize {
        self.attached.lock().map(|a| a.values().filter(|entry| entry.door.is_some()).count()).unwrap_or(0)
    }
}
