//! `[isolation.auto]`: how `isolation: "auto"` picks a tier, as data: an ordered list of rules, each a condition on
//! the tenant's trust and the request's `workload` and the tiers it allows in order of preference, plus whether a
//! microVM under software emulation may be picked. The evaluation is `lifecycle::auto_isolation`'s.

use sandkasten_types::{CodeNeeds, IoProfile, Tier};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::problem::Found;

/// Whether a tenant's code can be trusted not to attack the kernel it runs on (`trust` in `[[tenants]]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// Code of the operator's own people or systems.
    Internal,
    /// Code from anyone else, a model included (the default).
    #[default]
    Untrusted,
}

impl Trust {
    /// The name used in the config and in reasons.
    pub fn name(self) -> &'static str {
        match self {
            Trust::Internal => "internal",
            Trust::Untrusted => "untrusted",
        }
    }
}

/// The `[isolation]` table.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct IsolationConfig {
    /// How `isolation: "auto"` chooses (`[isolation.auto]`).
    pub auto: AutoConfig,
}

/// `[isolation.auto]`: the rules of `isolation: "auto"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AutoConfig {
    /// Whether `auto` may pick a microVM that runs under software emulation (TCG: isolation as strong, boots in
    /// seconds, code much slower). Default false: `auto` picks `microvm` only where guests run on KVM, and skips it
    /// otherwise (an explicit `isolation: "microvm"` is governed by `[microvm] allow_emulation` alone).
    pub allow_emulation: bool,
    /// The rules, in order: the first whose condition matches decides, and the sandbox gets the first of its `tiers`
    /// that is usable here (none usable: 422 `tier_unavailable` saying why each is not). No rule matching is 422
    /// too. Default: `DEFAULT_RULES` (docs/config.md): a kernel of its own → microvm; untrusted and syscall-heavy or
    /// needing a full Linux → microvm, else gvisor; untrusted → gvisor, else microvm; internal → process.
    pub rules: Vec<AutoRule>,
}

impl Default for AutoConfig {
    fn default() -> Self {
        AutoConfig { allow_emulation: false, rules: default_rules() }
    }
}

/// One rule: a condition (every field given must match; an empty condition matches everything) and the tiers it
/// allows, best first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AutoRule {
    /// The tenant's `trust` (`internal` or `untrusted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<Trust>,
    /// The request's `workload.needs_kernel` (unset in the request reads as false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs_kernel: Option<bool>,
    /// The request's `workload.needs` (`language` or `linux`); a request that does not say does not match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs: Option<CodeNeeds>,
    /// The request's `workload.io_profile` (`compute` or `syscall_heavy`); a request that does not say does not
    /// match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_profile: Option<IoProfile>,
    /// The tiers this rule allows, best first (`process`, `gvisor`, `microvm`; not `auto`, each once).
    pub tiers: Vec<Tier>,
}

impl AutoRule {
    /// A rule allowing `tiers` for everything (conditions are added with struct update syntax).
    fn any(tiers: &[Tier]) -> AutoRule {
        AutoRule { trust: None, needs_kernel: None, needs: None, io_profile: None, tiers: tiers.to_vec() }
    }
}

/// The default rules, in order.
pub fn default_rules() -> Vec<AutoRule> {
    let untrusted = Some(Trust::Untrusted);
    vec![
        AutoRule { needs_kernel: Some(true), ..AutoRule::any(&[Tier::Microvm]) },
        AutoRule {
            trust: untrusted,
            io_profile: Some(IoProfile::SyscallHeavy),
            ..AutoRule::any(&[Tier::Microvm, Tier::Gvisor])
        },
        AutoRule { trust: untrusted, needs: Some(CodeNeeds::Linux), ..AutoRule::any(&[Tier::Microvm, Tier::Gvisor]) },
        AutoRule { trust: untrusted, ..AutoRule::any(&[Tier::Gvisor, Tier::Microvm]) },
        AutoRule { trust: Some(Trust::Internal), ..AutoRule::any(&[Tier::Process]) },
    ]
}

impl AutoConfig {
    /// Every problem of the rules, at `isolation.auto.rules[i]…`.
    pub(crate) fn check(&self, found: &mut Found) {
        if self.rules.is_empty() {
            found.add(
                "isolation.auto.rules",
                "no rules: every isolation \"auto\" would be refused; leave rules out for the defaults or add one",
            );
        }
        for (index, rule) in self.rules.iter().enumerate() {
            let at = format!("isolation.auto.rules[{index}].tiers");
            if rule.tiers.is_empty() {
                found.add(&at, "no tiers: name the tiers this rule allows, best first (process, gvisor, microvm)");
            }
            if rule.tiers.contains(&Tier::Auto) {
                found.add(&at, "\"auto\" cannot be one of its own choices: name process, gvisor or microvm");
            }
            for (position, tier) in rule.tiers.iter().enumerate() {
                if rule.tiers[..position].contains(tier) {
                    found.add(&at, format!("{tier} is named more than once"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerConfig;

    #[test]
    fn rules_default_and_parse_in_order() -> Result<(), crate::config::ConfigError> {
        assert_eq!(ServerConfig::default().isolation.auto.rules, default_rules());
        let config = ServerConfig::from_toml_str(
            "[isolation.auto]\nallow_emulation = true\n\
             [[isolation.auto.rules]]\ntrust = \"internal\"\ntiers = [\"process\"]\n\
             [[isolation.auto.rules]]\ntiers = [\"gvisor\", \"microvm\"]\n",
        )?;
        assert!(config.isolation.auto.allow_emulation);
        assert_eq!(config.isolation.auto.rules[0].trust, Some(Trust::Internal));
        assert_eq!(config.isolation.auto.rules[1].tiers, [Tier::Gvisor, Tier::Microvm]);
        Ok(())
    }

    #[test]
    fn a_rule_naming_an_unknown_tier_or_condition_is_refused_at_its_line() {
        let text = "[[isolation.auto.rules]]\ntrust = \"internal\"\ntiers = [\"process\", \"firecracker\"]\n";
        let message = ServerConfig::from_toml_str(text).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("isolation.auto.rules[0].tiers[1]") && message.contains("firecracker"), "{message}");
        assert!(message.contains("gvisor") && message.contains("3:"), "{message}");
        let text = "[[isolation.auto.rules]]\ntrusted = true\ntiers = [\"process\"]\n";
        let message = ServerConfig::from_toml_str(text).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("trusted"), "{message}");
        let text = "[[isolation.auto.rules]]\ntrust = \"friendly\"\ntiers = [\"process\"]\n";
        let message = ServerConfig::from_toml_str(text).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("friendly") && message.contains("untrusted"), "{message}");
    }

    #[test]
    fn empty_auto_and_repeated_tiers_are_refused_naming_the_rule() {
        let mut found = Found::default();
        let config = AutoConfig {
            allow_emulation: false,
            rules: vec![AutoRule::any(&[]), AutoRule::any(&[Tier::Auto]), AutoRule::any(&[Tier::Gvisor, Tier::Gvisor])],
        };
        config.check(&mut found);
        let paths: Vec<String> = found.0.iter().map(|p| p.path.clone()).collect();
        assert_eq!(
            paths,
            ["isolation.auto.rules[0].tiers", "isolation.auto.rules[1].tiers", "isolation.auto.rules[2].tiers"]
        );
        let mut found = Found::default();
        AutoConfig { rules: Vec::new(), ..AutoConfig::default() }.check(&mut found);
        assert_eq!(found.0.len(), 1);
    }
}
