//! Image references: parsing and normalisation as containerd does (`busybox` → `docker.io/library/busybox:latest`).

use std::fmt;

/// A parsed, normalised image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// Registry host (`docker.io`, `127.0.0.1:5000`).
    pub registry: String,
    /// Repository path (`library/busybox`).
    pub repository: String,
    /// Tag, if given (or `latest` when neither tag nor digest was given).
    pub tag: Option<String>,
    /// Digest (`sha256:…`), if given.
    pub digest: Option<String>,
}

/// A reference that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid image reference {reference:?}: {reason}")]
pub struct InvalidReference {
    /// What the caller gave.
    pub reference: String,
    /// Why it is not a reference.
    pub reason: String,
}

impl ImageRef {
    /// Parses and normalises `s`.
    pub fn parse(s: &str) -> Result<Self, InvalidReference> {
        let invalid = |reason: String| InvalidReference {
            reference: s.to_string(),
            reason,
        };
        if s.is_empty() {
            return Err(invalid("empty reference".into()));
        }
        if s.trim() != s || s.chars().any(char::is_whitespace) {
            return Err(invalid("contains whitespace".into()));
        }
        let parsed: oci_client::Reference = s.parse().map_err(|e| invalid(format!("{e}")))?;
        if let Some(d) = parsed.digest() {
            validate_digest(d).map_err(invalid)?;
        }
        validate_repository(parsed.repository()).map_err(invalid)?;
        let mut r = Self {
            registry: parsed.registry().to_string(),
            repository: parsed.repository().to_string(),
            tag: parsed.tag().map(str::to_string),
            digest: parsed.digest().map(str::to_string),
        };
        if r.registry == "index.docker.io" || r.registry == "registry-1.docker.io" {
            r.registry = "docker.io".into();
        }
        if r.tag.is_none() && r.digest.is_none() {
            r.tag = Some("latest".into());
        }
        Ok(r)
    }

    /// `registry/repository`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// `registry/repository:tag`, if the reference has a tag.
    pub fn tagged(&self) -> Option<String> {
        self.tag.as_ref().map(|t| format!("{}:{t}", self.name()))
    }

    /// `registry/repository@digest` for a given manifest digest.
    pub fn with_digest(&self, digest: &str) -> String {
        format!("{}@{digest}", self.name())
    }

    /// The reference to ask the registry for: the digest when known, else the tag.
    pub fn fetch_reference(&self) -> oci_client::Reference {
        match (&self.digest, &self.tag) {
            (Some(d), _) => oci_client::Reference::with_digest(
                self.registry.clone(),
                self.repository.clone(),
                d.clone(),
            ),
            (None, Some(t)) => oci_client::Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                t.clone(),
            ),
            (None, None) => oci_client::Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                "latest".into(),
            ),
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// Checks a repository path: `/`-separated components of lowercase letters and digits, joined
/// inside a component by `.`, `_`, `__` or runs of `-` (the distribution spec's grammar).
fn validate_repository(repo: &str) -> Result<(), String> {
    for component in repo.split('/') {
        let bytes = component.as_bytes();
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let ok = !bytes.is_empty()
            && alnum(bytes[0])
            && alnum(bytes[bytes.len() - 1])
            && bytes
                .iter()
                .all(|&b| alnum(b) || matches!(b, b'.' | b'_' | b'-'))
            && !component.contains("..")
            && !component.contains("___")
            && !component.contains("._")
            && !component.contains("_.");
        if !ok {
            return Err(format!(
                "repository {repo:?} must be lowercase letters and digits separated by '.', '_', '__' or '-'"
            ));
        }
    }
    Ok(())
}

/// Checks `sha256:<64 lowercase hex>` (the only algorithm Berth stores).
pub fn validate_digest(d: &str) -> Result<(), String> {
    let Some(hex) = d.strip_prefix("sha256:") else {
        return Err(format!(
            "unsupported digest algorithm in {d:?} (only sha256)"
        ));
    };
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(format!("malformed digest {d:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    #[test]
    fn normalises_like_containerd() {
        let cases = [
            ("busybox", "docker.io/library/busybox:latest"),
            ("library/busybox:1.36", "docker.io/library/busybox:1.36"),
            ("docker.io/foo/bar", "docker.io/foo/bar:latest"),
            (
                "index.docker.io/library/busybox",
                "docker.io/library/busybox:latest",
            ),
            ("127.0.0.1:5000/busybox:x", "127.0.0.1:5000/busybox:x"),
            ("localhost:5000/a/b/c:v1", "localhost:5000/a/b/c:v1"),
            ("quay.io/x/y", "quay.io/x/y:latest"),
        ];
        for (input, want) in cases {
            let r = ImageRef::parse(input).expect(input);
            assert_eq!(r.to_string(), want, "{input}");
        }
    }

    #[test]
    fn digests_and_tag_plus_digest() {
        let r = ImageRef::parse(&format!("busybox@{D}")).expect("digest ref");
        assert_eq!(r.tag, None);
        assert_eq!(r.to_string(), format!("docker.io/library/busybox@{D}"));
        let r = ImageRef::parse(&format!("busybox:1@{D}")).expect("tag+digest");
        assert_eq!(r.tag.as_deref(), Some("1"));
        assert_eq!(r.digest.as_deref(), Some(D));
        assert_eq!(r.fetch_reference().digest(), Some(D));
    }

    #[test]
    fn malformed_references_are_refused() {
        for bad in [
            "",
            "UPPER/case",
            "busybox:",
            "busybox@sha256:abc",
            "busybox@md5:0123",
            " busybox",
            "a b",
            "busybox:tag:tag",
            "-leading/dash",
        ] {
            let err = ImageRef::parse(bad).expect_err(bad);
            assert!(err.to_string().contains("invalid image reference"), "{err}");
        }
    }
}
