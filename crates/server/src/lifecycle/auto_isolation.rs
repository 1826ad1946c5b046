//! `isolation: "auto"`: the one place the tier of such a sandbox is chosen, from the tenant's trust, the request's
//! `workload` and the tiers this host can run, by the ordered rules of `[isolation.auto]`. The first rule whose
//! condition matches decides; the sandbox gets the first of its tiers that is usable here (a microVM under software
//! emulation only when `allow_emulation` says so); the reason says which rule and what was skipped, and no usable
//! tier is a refusal naming why each was not. The CLI's local `sandkasten run --isolation auto` runs the same rules
//! (`choose`, with the host's tiers as its runtime sees them).

use std::collections::BTreeMap;

use sandkasten_types::{Isolation, MicrovmAccel, Tier, Workload};

use crate::config::{AutoConfig, AutoRule, Trust};

/// What this host can run now, as the runtime says.
#[derive(Debug, Clone, Default)]
pub struct HostTiers {
    /// Why each tier that cannot run here cannot (a tier absent is usable).
    pub unusable: BTreeMap<Tier, String>,
    /// The acceleration a new microVM would get here (`None`: the runtime runs no microVMs).
    pub microvm_accel: Option<MicrovmAccel>,
}

/// The tier `auto` gives a sandbox of a `trust` tenant asking for `workload`, with its reason; or why none.
pub fn choose(auto: &AutoConfig, trust: Trust, workload: &Workload, host: &HostTiers) -> Result<Isolation, String> {
    let Some((index, rule)) = auto.rules.iter().enumerate().find(|(_, rule)| matches(rule, trust, workload)) else {
        return Err(format!(
            "isolation \"auto\": no [isolation.auto] rule matches an {} tenant's sandbox with {}: name a tier, or add \
             a rule that matches",
            trust.name(),
            describe_workload(workload)
        ));
    };
    let rule_words = format!("rule {} ({})", index + 1, describe_condition(rule));
    let mut skipped = Vec::new();
    for &tier in &rule.tiers {
        match why_not(auto, tier, host) {
            Some(why) => skipped.push(format!("{tier} skipped: {why}")),
            None => {
                let mut reason = format!("auto: {rule_words} chose {tier}");
                if !skipped.is_empty() {
                    reason.push_str(&format!("; {}", skipped.join("; ")));
                }
                let accel = (tier == Tier::Microvm).then_some(host.microvm_accel).flatten();
                return Ok(Isolation { tier, reason, accel });
            }
        }
    }
    let allowed: Vec<&str> = rule.tiers.iter().map(|tier| tier.name()).collect();
    Err(format!(
        "isolation \"auto\": {rule_words} allows {} and none is usable here ({}): install one, or name a tier",
        allowed.join(", "),
        skipped.join("; ")
    ))
}

/// Whether `rule`'s condition holds: each field it gives equals the request's (an unsaid `needs` or `io_profile`
/// matches no rule that asks about it).
fn matches(rule: &AutoRule, trust: Trust, workload: &Workload) -> bool {
    rule.trust.is_none_or(|wanted| wanted == trust)
        && rule.needs_kernel.is_none_or(|wanted| wanted == workload.needs_kernel)
        && rule.needs.is_none_or(|wanted| Some(wanted) == workload.needs)
        && rule.io_profile.is_none_or(|wanted| Some(wanted) == workload.io_profile)
}

/// Why `auto` may not pick `tier` here, if it may not.
fn why_not(auto: &AutoConfig, tier: Tier, host: &HostTiers) -> Option<String> {
    if let Some(why) = host.unusable.get(&tier) {
        return Some(why.clone());
    }
    let emulated = tier == Tier::Microvm && host.microvm_accel != Some(MicrovmAccel::Kvm);
    (emulated && !auto.allow_emulation).then(|| {
        "guests run under software emulation here, which auto does not pick unless [isolation.auto] \
         allow_emulation = true"
            .to_owned()
    })
}

fn describe_condition(rule: &AutoRule) -> String {
    let mut parts = Vec::new();
    if let Some(trust) = rule.trust {
        parts.push(format!("{} tenant", trust.name()));
    }
    match rule.needs_kernel {
        Some(true) => parts.push("needs its own kernel".to_owned()),
        Some(false) => parts.push("needs no kernel of its own".to_owned()),
        None => {}
    }
    if let Some(needs) = rule.needs {
        parts.push(format!("needs {}", serde_name(&needs)));
    }
    if let Some(profile) = rule.io_profile {
        parts.push(format!("io_profile {}", serde_name(&profile)));
    }
    if parts.is_empty() { "any sandbox".to_owned() } else { parts.join(", ") }
}

fn describe_workload(workload: &Workload) -> String {
    if workload.is_unset() {
        return "no workload said".to_owned();
    }
    format!("workload {}", serde_json::to_string(workload).unwrap_or_default())
}

/// A value's JSON name (`syscall_heavy`).
fn serde_name(value: &impl serde::Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use sandkasten_types::{CodeNeeds, IoProfile};

    use super::*;

    /// A host on which `usable` tiers run, microVMs with `accel`.
    fn host(usable: &[Tier], accel: MicrovmAccel) -> HostTiers {
        let unusable = Tier::CREATABLE
            .into_iter()
            .filter(|tier| !usable.contains(tier))
            .map(|tier| (tier, format!("{tier} is not installed")))
            .collect();
        HostTiers { unusable, microvm_accel: Some(accel) }
    }

    fn workload(needs_kernel: bool, needs: Option<CodeNeeds>, io_profile: Option<IoProfile>) -> Workload {
        Workload { needs, io_profile, needs_kernel }
    }

    /// Every combination of trust × needs_kernel × needs × io_profile × usable tiers × acceleration ×
    /// allow_emulation, against what the default rules promise.
    #[test]
    fn the_default_rules_decide_every_combination_as_documented() {
        let everything = [Tier::Process, Tier::Gvisor, Tier::Microvm];
        let subsets: Vec<Vec<Tier>> = (0..8u8)
            .map(|bits| everything.iter().enumerate().filter(|(i, _)| bits & (1 << i) != 0).map(|(_, t)| *t).collect())
            .collect();
        let mut checked = 0;
        for trust in [Trust::Internal, Trust::Untrusted] {
            for needs_kernel in [false, true] {
                for needs in [None, Some(CodeNeeds::Language), Some(CodeNeeds::Linux)] {
                    for io_profile in [None, Some(IoProfile::Compute), Some(IoProfile::SyscallHeavy)] {
                        for usable in &subsets {
                            for accel in [MicrovmAccel::Kvm, MicrovmAccel::Tcg] {
                                for allow_emulation in [false, true] {
                                    let auto = AutoConfig { allow_emulation, ..AutoConfig::default() };
                                    let asked = workload(needs_kernel, needs, io_profile);
                                    let got = choose(&auto, trust, &asked, &host(usable, accel));
                                    let microvm_ok = usable.contains(&Tier::Microvm)
                                        && (accel == MicrovmAccel::Kvm || allow_emulation);
                                    let gvisor_ok = usable.contains(&Tier::Gvisor);
                                    let wants_vm_first =
                                        io_profile == Some(IoProfile::SyscallHeavy) || needs == Some(CodeNeeds::Linux);
                                    let expected = if needs_kernel {
                                        microvm_ok.then_some(Tier::Microvm)
                                    } else if trust == Trust::Untrusted {
                                        let order = if wants_vm_first {
                                            [(microvm_ok, Tier::Microvm), (gvisor_ok, Tier::Gvisor)]
                                        } else {
                                            [(gvisor_ok, Tier::Gvisor), (microvm_ok, Tier::Microvm)]
                                        };
                                        order.into_iter().find(|(ok, _)| *ok).map(|(_, tier)| tier)
                                    } else {
                                        usable.contains(&Tier::Process).then_some(Tier::Process)
                                    };
                                    let case = format!(
                                        "{trust:?} kernel={needs_kernel} {needs:?} {io_profile:?} {usable:?} \
                                         {accel:?} emulation={allow_emulation}: {got:?}"
                                    );
                                    assert_eq!(got.as_ref().ok().map(|i| i.tier), expected, "{case}");
                                    if trust == Trust::Untrusted {
                                        assert_ne!(expected, Some(Tier::Process), "{case}");
                                    }
                                    match &got {
                                        Ok(isolation) => {
                                            assert!(isolation.reason.starts_with("auto: rule "), "{case}");
                                            let vm = isolation.tier == Tier::Microvm;
                                            assert_eq!(isolation.accel, vm.then_some(accel), "{case}");
                                        }
                                        Err(message) => assert!(message.contains("none is usable here"), "{case}"),
                                    }
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 2 * 3 * 3 * 8 * 2 * 2);
    }

    #[test]
    fn the_reason_names_the_rule_and_what_was_skipped() -> Result<(), String> {
        let asked = workload(false, None, Some(IoProfile::SyscallHeavy));
        let got = choose(&AutoConfig::default(), Trust::Untrusted, &asked, &host(&Tier::CREATABLE, MicrovmAccel::Tcg))?;
        assert_eq!(got.tier, Tier::Gvisor);
        assert!(got.reason.contains("rule 2 (untrusted tenant, io_profile syscall_heavy) chose gvisor"), "{got:?}");
        assert!(got.reason.contains("microvm skipped: guests run under software emulation"), "{got:?}");
        Ok(())
    }

    #[test]
    fn no_usable_tier_and_no_matching_rule_are_refusals_saying_why() {
        let asked = workload(true, None, None);
        let message =
            choose(&AutoConfig::default(), Trust::Internal, &asked, &host(&[Tier::Process], MicrovmAccel::Kvm))
                .err()
                .unwrap_or_default();
        assert!(message.contains("rule 1 (needs its own kernel) allows microvm"), "{message}");
        assert!(message.contains("microvm is not installed"), "{message}");
        let only_internal = AutoConfig {
            rules: vec![AutoRule {
                trust: Some(Trust::Internal),
                needs_kernel: None,
                needs: None,
                io_profile: None,
                tiers: vec![Tier::Process],
            }],
            ..AutoConfig::default()
        };
        let message =
            choose(&only_internal, Trust::Untrusted, &Workload::default(), &host(&Tier::CREATABLE, MicrovmAccel::Kvm))
                .err()
                .unwrap_or_default();
        assert!(message.contains("no [isolation.auto] rule matches an untrusted tenant's sandbox"), "{message}");
    }

    #[test]
    fn an_operator_rule_list_is_followed_in_order() -> Result<(), String> {
        let rules = vec![
            AutoRule {
                needs: Some(CodeNeeds::Language),
                needs_kernel: None,
                trust: None,
                io_profile: None,
                tiers: vec![Tier::Process],
            },
            AutoRule { needs: None, needs_kernel: None, trust: None, io_profile: None, tiers: vec![Tier::Gvisor] },
        ];
        let auto = AutoConfig { rules, allow_emulation: false };
        let all = host(&Tier::CREATABLE, MicrovmAccel::Kvm);
        let language = workload(false, Some(CodeNeeds::Language), None);
        assert_eq!(choose(&auto, Trust::Untrusted, &language, &all)?.tier, Tier::Process);
        assert_eq!(choose(&auto, Trust::Untrusted, &Workload::default(), &all)?.tier, Tier::Gvisor);
        Ok(())
    }
}
