//! Isolation tiers: how strongly a sandbox is separated from the host. One type for the request (`isolation` on a
//! sandbox spec), the records, the pools and every result.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The isolation a sandbox asks for.
///
/// JSON: `"process"`, `"gvisor"`, `"microvm"` or `"auto"`.
///
/// Parsed through `FromStr`, so that any wrong value — a misspelt name, a number, `null` inside a list — is answered
/// with the allowed names (serde's own enum parsing calls a number a JSON syntax error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Linux namespaces, pivot_root, seccomp, landlock and cgroups around code that shares the host kernel. Fastest;
    /// for code that is trusted not to carry a kernel exploit.
    #[default]
    Process,
    /// gVisor (`runsc`): the code talks to a user-space kernel (the Sentry) that itself runs under a tight seccomp
    /// filter; only a few dozen host syscalls are reachable. No KVM needed.
    Gvisor,
    /// A guest kernel of its own in a VMM (QEMU's `microvm` machine) that itself runs in a process-tier jail. The
    /// strongest boundary; needs KVM for speed (software emulation works, much slower).
    Microvm,
    /// Chosen per sandbox by the server from the request's `workload` and the tenant's trust (`[isolation.auto]`).
    Auto,
}

impl Tier {
    /// Every value, in the order they are documented.
    pub const ALL: [Tier; 4] = [Tier::Process, Tier::Gvisor, Tier::Microvm, Tier::Auto];

    /// The tiers every behaviour suite covers (`per_tier!` in the CLI's tests): all of them.
    pub const AVAILABLE: [Tier; 3] = [Tier::Process, Tier::Gvisor, Tier::Microvm];

    /// The tiers a sandbox runs on (`auto` resolves to one of them before the sandbox exists).
    pub const CREATABLE: [Tier; 3] = [Tier::Process, Tier::Gvisor, Tier::Microvm];

    /// The tiers that save a running sandbox's memory (processes and all) as well as its files: gVisor (`runsc
    /// checkpoint`) and microVM (QEMU's migration to a file).
    pub const SAVES_MEMORY: [Tier; 2] = [Tier::Gvisor, Tier::Microvm];

    /// Whether this tier takes memory snapshots (`SAVES_MEMORY`).
    pub fn saves_memory(self) -> bool {
        Tier::SAVES_MEMORY.contains(&self)
    }

    /// The name used in JSON, on the command line and in records.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Process => "process",
            Tier::Gvisor => "gvisor",
            Tier::Microvm => "microvm",
            Tier::Auto => "auto",
        }
    }

    /// Parses a name as written in JSON (`None` for anything else).
    pub fn from_name(name: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|tier| tier.name() == name)
    }

    /// Why a sandbox cannot run on this tier as it is, if it cannot (a message for the user): `auto` is a choice
    /// the server makes, never a tier a sandbox runs on.
    pub fn unavailable_reason(self) -> Option<&'static str> {
        match self {
            Tier::Process | Tier::Gvisor | Tier::Microvm => None,
            Tier::Auto => Some(
                "isolation \"auto\" is resolved before a sandbox exists (by a server's or `sandkasten run`'s \
                 [isolation.auto] rules): name a tier (\"process\", \"gvisor\" or \"microvm\") here",
            ),
        }
    }
}

/// What a tier is read from: any JSON or TOML value, checked by `Tier::from_str`.
#[derive(Deserialize)]
#[serde(untagged)]
enum TierName {
    Name(String),
    Other(serde_json::Value),
}

impl<'de> Deserialize<'de> for Tier {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Tier, D::Error> {
        let parsed = match TierName::deserialize(deserializer)? {
            TierName::Name(name) => name.parse(),
            TierName::Other(value) => format!("{value}")
                .parse::<Tier>()
                .map_err(|error| error.replace("unknown isolation", "isolation must be a tier's name, not")),
        };
        parsed.map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Tier {
    type Err = String;

    fn from_str(name: &str) -> Result<Tier, String> {
        Tier::from_name(name).ok_or_else(|| {
            let allowed: Vec<&str> = Tier::ALL.iter().map(|tier| tier.name()).collect();
            format!("unknown isolation '{name}': expected one of {}", allowed.join(", "))
        })
    }
}

/// How the gvisor tier runs `runsc` (the server's `[gvisor]` table).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct GvisorSettings {
    /// The `runsc` binary: a path, or a name looked up on PATH. Default `runsc` (Debian installs `/usr/bin/runsc`).
    pub runsc: std::path::PathBuf,
    /// gVisor's platform: how the Sentry intercepts the sandbox's system calls. Default `systrap`.
    pub platform: GvisorPlatform,
}

impl Default for GvisorSettings {
    fn default() -> Self {
        GvisorSettings { runsc: "runsc".into(), platform: GvisorPlatform::Systrap }
    }
}

/// How the microvm tier runs its VMs (the server's `[microvm]` table).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MicrovmSettings {
    /// Where `scripts/setup-microvm.sh` put the guest kernel (`vmlinuz`), the initramfs (`initrd.img`) and the
    /// read-only root image (`rootfs.ext4`); the agent's disk images are cached beside them. Default
    /// `/var/lib/sandkasten/microvm`.
    pub dir: std::path::PathBuf,
    /// The QEMU binary: a path, or a name looked up on PATH. Default `qemu-system-x86_64`.
    pub qemu: std::path::PathBuf,
    /// How guests run: `auto` (default: KVM where the speed probe measured it clearly faster than software
    /// emulation, otherwise TCG; measured once per host boot and cached in `dir`), `kvm` or `tcg`.
    pub accel: MicrovmAccel,
    /// Whether software emulation (QEMU's TCG: isolation as strong, much slower) may run microVMs. Default true.
    pub allow_emulation: bool,
    /// Whether a pause with memory releases the VM: its memory and devices are saved to a file in the sandbox's
    /// directory and the VMM ends, freeing the guest's RAM (the resume starts a VMM from the file: about a second).
    /// `false`: the VM is stopped in place (QMP `stop` under the cgroup freeze; its RAM stays held, the resume is
    /// instant). Default true.
    pub release_paused: bool,
    /// Guest kernel parameters appended to the tier's own command line (so a later one wins where the kernel takes
    /// the last), e.g. `sysctl.vm.panic_on_oom=1` or `mitigations=off`: each one word of printable ASCII without
    /// quotes, at most `MAX_KERNEL_ARGS_BYTES` in all. An operator's parameter can keep guests from booting; the
    /// sandbox's create then fails with the guest console's last words. Default none.
    pub kernel_args: Vec<String>,
}

/// The bytes `[microvm] kernel_args` may add to the guest kernel's command line (x86's limit is 2048 in all; the
/// tier's own parameters take about 250).
pub const MAX_KERNEL_ARGS_BYTES: usize = 1024;

impl MicrovmSettings {
    /// What is wrong with `kernel_args`, if anything.
    pub fn kernel_args_problem(&self) -> Option<String> {
        for (index, arg) in self.kernel_args.iter().enumerate() {
            if arg.is_empty() || !arg.bytes().all(|b| b.is_ascii_graphic() && b != b'"') {
                return Some(format!(
                    "[{index}] {arg:?} is not one kernel parameter: give each as one word of printable ASCII without                      spaces or quotes, e.g. \"sysctl.vm.panic_on_oom=1\""
                ));
            }
            if arg == "--" {
                return Some(format!(
                    "[{index}] \"--\" would hand the rest of the command line to the guest's init: leave it out"
                ));
            }
        }
        let total: usize = self.kernel_args.iter().map(|arg| arg.len() + 1).sum();
        (total > MAX_KERNEL_ARGS_BYTES).then(|| {
            format!("{total} bytes in all, more than {MAX_KERNEL_ARGS_BYTES}: the guest kernel's command line is short")
        })
    }
}

impl Default for MicrovmSettings {
    fn default() -> Self {
        MicrovmSettings {
            dir: "/var/lib/sandkasten/microvm".into(),
            qemu: "qemu-system-x86_64".into(),
            accel: MicrovmAccel::Auto,
            allow_emulation: true,
            release_paused: true,
            kernel_args: Vec::new(),
        }
    }
}

/// How a microVM's guest runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum MicrovmAccel {
    /// KVM where the speed probe (the same tiny guest under KVM and TCG) measured it at least twice as fast as TCG,
    /// else TCG.
    #[default]
    Auto,
    /// Hardware virtualisation through `/dev/kvm`.
    Kvm,
    /// QEMU's software emulation.
    Tcg,
}

impl MicrovmAccel {
    /// The name QEMU takes (`-accel NAME`) and results report (`auto` never reaches QEMU).
    pub fn name(self) -> &'static str {
        match self {
            MicrovmAccel::Auto => "auto",
            MicrovmAccel::Kvm => "kvm",
            MicrovmAccel::Tcg => "tcg",
        }
    }
}

/// gVisor's platforms that need no KVM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GvisorPlatform {
    /// seccomp traps (gVisor's default; fast, works inside VMs).
    #[default]
    Systrap,
    /// ptrace (slower; for hosts where systrap cannot run).
    Ptrace,
}

impl GvisorPlatform {
    /// The name runsc takes (`--platform=NAME`).
    pub fn name(self) -> &'static str {
        match self {
            GvisorPlatform::Systrap => "systrap",
            GvisorPlatform::Ptrace => "ptrace",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_json_and_from_str() {
        for tier in Tier::ALL {
            let json = serde_json::to_string(&tier).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", tier.name()));
            assert_eq!(tier.name().parse::<Tier>(), Ok(tier));
        }
    }

    #[test]
    fn a_value_of_the_wrong_type_is_a_data_error_naming_the_allowed_values() {
        let error = serde_json::from_str::<Tier>("7").err().map(|e| (e.classify(), e.to_string()));
        let (category, message) = error.unwrap_or((serde_json::error::Category::Io, String::new()));
        assert_eq!(category, serde_json::error::Category::Data, "{message}");
        assert!(message.contains("process, gvisor, microvm, auto"), "{message}");
        let misspelt = serde_json::from_str::<Tier>("\"gvsior\"").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(misspelt.contains("unknown isolation 'gvsior'") && misspelt.contains("gvisor"), "{misspelt}");
    }

    #[test]
    fn a_misspelt_tier_names_the_allowed_values() {
        let error = "gvsior".parse::<Tier>().err().unwrap_or_default();
        assert!(error.contains("process, gvisor, microvm, auto"), "{error}");
    }

    #[test]
    fn only_the_creatable_tiers_create_sandboxes() {
        for tier in Tier::ALL {
            assert_eq!(tier.unavailable_reason().is_none(), Tier::CREATABLE.contains(&tier), "{tier}");
        }
        assert!(Tier::AVAILABLE.iter().all(|tier| Tier::CREATABLE.contains(tier)));
    }

    #[test]
    fn operator_kernel_args_are_single_printable_words_within_a_bound() {
        let with = |args: &[&str]| MicrovmSettings {
            kernel_args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            ..MicrovmSettings::default()
        };
        assert_eq!(with(&[]).kernel_args_problem(), None);
        assert_eq!(with(&["sysctl.vm.panic_on_oom=1", "mitigations=off"]).kernel_args_problem(), None);
        for bad in ["two words", "", "quote=\"x\"", "tab\there", "--", "nul\0"] {
            let problem = with(&["ok", bad]).kernel_args_problem();
            assert!(problem.as_deref().is_some_and(|p| p.starts_with("[1] ")), "{bad:?}: {problem:?}");
        }
        let long = "x".repeat(MAX_KERNEL_ARGS_BYTES);
        assert!(with(&[&long]).kernel_args_problem().is_some_and(|p| p.contains("in all")));
    }
}
