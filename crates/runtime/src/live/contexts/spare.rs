//! Spare kernels: per sandbox and language at most one kernel started ahead of any context (a warm pool member's,
//! with the pool's preload modules loaded), waiting for the sandbox's first context of that language to adopt it.
//! A spare has run no caller's code and is handed out once; a sandbox's spares go with it.
//!
//! Generic over the kernel so the bookkeeping is testable without a sandbox.

use std::collections::HashMap;

use sandkasten_types::CodeLanguage;

/// The spare kernels of every sandbox of one runtime.
#[derive(Debug)]
pub(crate) struct Spares<K> {
    by_sandbox: HashMap<String, HashMap<CodeLanguage, K>>,
}

impl<K> Default for Spares<K> {
    fn default() -> Self {
        Spares { by_sandbox: HashMap::new() }
    }
}

impl<K> Spares<K> {
    /// Keeps `kernel` as the spare of `sandbox` for `language`; returns the one it replaces, if any.
    pub(crate) fn put(&mut self, sandbox: &str, language: CodeLanguage, kernel: K) -> Option<K> {
        self.by_sandbox.entry(sandbox.to_owned()).or_default().insert(language, kernel)
    }

    /// Takes the spare of `sandbox` for `language`: it is nobody's spare any more.
    pub(crate) fn take(&mut self, sandbox: &str, language: CodeLanguage) -> Option<K> {
        let spares = self.by_sandbox.get_mut(sandbox)?;
        let kernel = spares.remove(&language);
        if spares.is_empty() {
            self.by_sandbox.remove(sandbox);
        }
        kernel
    }

    /// Takes every spare of `sandbox`.
    pub(crate) fn take_all(&mut self, sandbox: &str) -> Vec<K> {
        self.by_sandbox.remove(sandbox).map(|spares| spares.into_values().collect()).unwrap_or_default()
    }

    /// Takes every spare of every sandbox.
    pub(crate) fn clear(&mut self) -> Vec<K> {
        self.by_sandbox.drain().flat_map(|(_, spares)| spares.into_values()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spare_is_handed_out_once_and_only_for_its_language() {
        let mut spares = Spares::default();
        assert_eq!(spares.put("sb-a", CodeLanguage::Python, "py"), None);
        assert_eq!(spares.take("sb-a", CodeLanguage::Javascript), None, "no JavaScript spare");
        assert_eq!(spares.take("sb-a", CodeLanguage::Python), Some("py"));
        assert_eq!(spares.take("sb-a", CodeLanguage::Python), None, "the second context starts cold");
        assert!(spares.by_sandbox.is_empty(), "nothing kept for a sandbox without spares");
    }

    #[test]
    fn a_sandbox_never_gets_another_sandboxs_spare() {
        let mut spares = Spares::default();
        spares.put("sb-a", CodeLanguage::Python, "a");
        assert_eq!(spares.take("sb-b", CodeLanguage::Python), None);
        assert_eq!(spares.take_all("sb-b"), Vec::<&str>::new());
        assert_eq!(spares.take("sb-a", CodeLanguage::Python), Some("a"));
    }

    #[test]
    fn a_new_spare_replaces_the_old_one_which_is_returned() {
        let mut spares = Spares::default();
        spares.put("sb-a", CodeLanguage::Python, "old");
        assert_eq!(spares.put("sb-a", CodeLanguage::Python, "new"), Some("old"));
        assert_eq!(spares.take("sb-a", CodeLanguage::Python), Some("new"));
    }

    #[test]
    fn a_sandboxs_spares_go_with_it() {
        let mut spares = Spares::default();
        spares.put("sb-a", CodeLanguage::Python, "py");
        spares.put("sb-a", CodeLanguage::Javascript, "js");
        spares.put("sb-b", CodeLanguage::Python, "b");
        let mut gone = spares.take_all("sb-a");
        gone.sort_unstable();
        assert_eq!(gone, vec!["js", "py"]);
        assert_eq!(spares.take("sb-a", CodeLanguage::Javascript), None);
        assert_eq!(spares.clear(), vec!["b"]);
        assert!(spares.by_sandbox.is_empty());
    }
}
