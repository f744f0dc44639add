//! Pinned images (`images.pinned_images`): reported `pinned` by ListImages and ImageStatus, so
//! the kubelet's and the agent's image garbage collection pass them by. A pattern is matched
//! as CRI-O matches its own: a reference, normalised (`busybox` names
//! `docker.io/library/busybox:latest`) and equal to one of the image's tags or digests; a
//! prefix ending in `*`; or a keyword between two `*`.

use super::reference::ImageRef;
use crate::store::ImageRecord;

/// The configured patterns, sorted by kind.
#[derive(Debug, Default, Clone)]
pub struct Pins {
    exact: Vec<String>,
    prefixes: Vec<String>,
    keywords: Vec<String>,
}

/// A pattern that is none of the three kinds.
#[derive(Debug, thiserror::Error)]
#[error("images.pinned_images entry {pattern:?}: {reason}")]
pub struct PinError {
    pattern: String,
    reason: String,
}

impl Pins {
    /// Reads `patterns`; a pattern that is not a reference, a prefix or a keyword is an error.
    pub fn new(patterns: &[String]) -> Result<Self, PinError> {
        let mut pins = Pins::default();
        for p in patterns {
            let err = |reason: &str| PinError {
                pattern: p.clone(),
                reason: reason.into(),
            };
            let p = p.trim();
            if let Some(inner) = p.strip_prefix('*').and_then(|r| r.strip_suffix('*')) {
                if inner.is_empty() || inner.contains('*') {
                    return Err(err("a keyword is *word*, with no * inside"));
                }
                pins.keywords.push(inner.to_string());
            } else if let Some(prefix) = p.strip_suffix('*') {
                if prefix.is_empty() || prefix.contains('*') {
                    return Err(err("a prefix is name* with no other *"));
                }
                pins.prefixes.push(prefix.to_string());
            } else {
                let r = ImageRef::parse(p).map_err(|e| err(&e.reason))?;
                pins.exact.push(r.to_string());
            }
        }
        Ok(pins)
    }

    /// Whether `image` is pinned: by its record or by a pattern matching one of its names.
    pub fn covers(&self, image: &ImageRecord) -> bool {
        image.pinned
            || image
                .repo_tags
                .iter()
                .chain(&image.repo_digests)
                .any(|name| self.matches(name))
    }

    fn matches(&self, name: &str) -> bool {
        self.exact.iter().any(|e| e == name)
            || self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
            || self.keywords.iter().any(|k| name.contains(k.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(tags: &[&str], digests: &[&str]) -> ImageRecord {
        ImageRecord {
            repo_tags: tags.iter().map(|s| s.to_string()).collect(),
            repo_digests: digests.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn references_prefixes_and_keywords_match_as_configured() {
        let pins = Pins::new(&[
            "busybox".to_string(),
            "registry.local:5000/infra/*".to_string(),
            "*pause*".to_string(),
        ])
        .expect("patterns");
        assert!(pins.covers(&record(&["docker.io/library/busybox:latest"], &[])));
        assert!(!pins.covers(&record(&["docker.io/library/busybox:1.36"], &[])));
        assert!(pins.covers(&record(&[], &["registry.local:5000/infra/dns@sha256:ab"])));
        assert!(pins.covers(&record(&["registry.k8s.io/pause:3.10"], &[])));
        assert!(!pins.covers(&record(&["docker.io/library/nginx:latest"], &[])));
        let mut stored = record(&["docker.io/library/nginx:latest"], &[]);
        stored.pinned = true;
        assert!(pins.covers(&stored), "pinned in the record");
        assert!(!Pins::default().covers(&record(&["docker.io/library/busybox:latest"], &[])));
    }

    #[test]
    fn malformed_patterns_are_refused_naming_them() {
        for bad in ["*", "**", "a*b*", "*a*b*", "UPPER/Case", ""] {
            let e = Pins::new(&[bad.to_string()]).expect_err(bad);
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }
}
