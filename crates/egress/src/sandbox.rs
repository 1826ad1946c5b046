//! What the proxy knows about one sandbox: identity, its current policy and secrets (both changeable while
//! the sandbox runs) and its interception CA.

use std::sync::{Arc, RwLock};

use tokio::sync::Semaphore;

use crate::ca::SandboxCa;
use crate::io::Traffic;
use crate::policy::Policy;
use crate::resolve::MAX_LOOKUPS_PER_SANDBOX;
use crate::secrets::{CompiledSecret, Secret, SecretError};

/// Per-sandbox egress state shared between the server and the proxy.
#[derive(Debug)]
pub struct SandboxEgress {
    /// The sandbox's id (for audit events).
    pub sandbox_id: String,
    /// The sandbox's tenant (for audit events).
    pub tenant: String,
    policy: RwLock<Arc<Policy>>,
    secrets: RwLock<Arc<Vec<CompiledSecret>>>,
    ca: Option<SandboxCa>,
    /// Places for this sandbox's system name lookups in flight.
    lookups: Arc<Semaphore>,
    /// What its connections moved so far.
    traffic: Arc<Traffic>,
}

impl SandboxEgress {
    /// State for one sandbox with no secrets. Without a CA, HTTPS is never intercepted (secrets then only
    /// work over plain HTTP).
    pub fn new(
        sandbox_id: impl Into<String>,
        tenant: impl Into<String>,
        policy: Policy,
        ca: Option<SandboxCa>,
    ) -> Self {
        SandboxEgress {
            sandbox_id: sandbox_id.into(),
            tenant: tenant.into(),
            policy: RwLock::new(Arc::new(policy)),
            secrets: RwLock::new(Arc::new(Vec::new())),
            ca,
            lookups: Arc::new(Semaphore::new(MAX_LOOKUPS_PER_SANDBOX)),
            traffic: Arc::default(),
        }
    }

    /// Replaces the policy; applies to every request and CONNECT that starts afterwards, including each request
    /// inside an intercepted tunnel (open blind tunnels and in-flight requests keep the decision they got).
    pub fn set_policy(&self, policy: Policy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(policy);
    }

    /// The current policy.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the secrets; all are checked first and nothing changes if one is invalid.
    pub fn set_secrets(&self, secrets: Vec<Secret>) -> Result<(), SecretError> {
        let compiled = secrets.iter().map(CompiledSecret::compile).collect::<Result<Vec<_>, _>>()?;
        *self.secrets.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(compiled);
        Ok(())
    }

    pub(crate) fn secrets(&self) -> Arc<Vec<CompiledSecret>> {
        self.secrets.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn lookups(&self) -> &Arc<Semaphore> {
        &self.lookups
    }

    /// The bytes the sandbox's connections moved so far (upstream side), live.
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    pub(crate) fn traffic_counters(&self) -> Arc<Traffic> {
        Arc::clone(&self.traffic)
    }

    /// The interception CA, if the sandbox has one.
    pub fn ca(&self) -> Option<&SandboxCa> {
        self.ca.as_ref()
    }
}
