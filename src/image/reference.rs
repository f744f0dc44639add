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
    /// Parses and normalises `s` (`[domain/]path[:tag][@digest]`, the distribution grammar).
    ///
    /// Hand-written rather than oci-spec's regex: that regex costs ~5 MiB of heap for the
    /// life of the daemon, a quarter of berthd's memory budget.
    pub fn parse(s: &str) -> Result<Self, InvalidReference> {
        let invalid = |reason: String| InvalidReference {
            reference: s.to_string(),
            reason,
        };
        if s.is_empty() {
            return Err(invalid("empty reference".into()));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid("contains whitespace".into()));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                validate_digest(d).map_err(invalid)?;
                (r, Some(d.to_string()))
            }
            None => (s, None),
        };
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let (n, t) = rest.split_at(last_slash + i);
                (n, Some(t[1..].to_string()))
            }
            None => (rest, None),
        };
        if let Some(t) = &tag {
            validate_tag(t).map_err(invalid)?;
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                validate_domain(first).map_err(invalid)?;
                (first.to_string(), path.to_string())
            }
            Some(_) => ("docker.io".to_string(), name.to_string()),
            None => ("docker.io".to_string(), format!("library/{name}")),
        };
        let registry = match registry.as_str() {
            "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
            _ => registry,
        };
        let repository = if registry == "docker.io" && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        validate_repository(&repository).map_err(invalid)?;
        // The limit is on the normalised name (as in containerd): a reference must print as
        // one that parses.
        if registry.len() + 1 + repository.len() > 255 {
            return Err(invalid("name longer than 255 characters".into()));
        }
        let tag = if tag.is_none() && digest.is_none() {
            Some("latest".to_string())
        } else {
            tag
        };
        Ok(Self {
            registry,
            repository,
            tag,
            digest,
        })
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

/// Checks a tag: a word character, then up to 127 word characters, `.` or `-`.
fn validate_tag(tag: &str) -> Result<(), String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut chars = tag.chars();
    let ok = tag.len() <= 128
        && chars.next().is_some_and(word)
        && chars.all(|c| word(c) || c == '.' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!("invalid tag {tag:?}"))
    }
}

/// Checks a registry host: DNS labels (or an IPv6 literal in brackets), optional `:port`.
fn validate_domain(domain: &str) -> Result<(), String> {
    let bad = || Err(format!("invalid registry host {domain:?}"));
    let (host, port) = if let Some(rest) = domain.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, tail)) if !ip.is_empty() => (ip, tail.strip_prefix(':')),
            _ => return bad(),
        }
    } else {
        match domain.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (domain, None),
        }
    };
    if let Some(p) = port
        && (p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return bad();
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if !domain.starts_with('[') && !host.split('.').all(label_ok) {
        return bad();
    }
    Ok(())
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
            ("localhost/foo", "localhost/foo:latest"),
            ("[::1]:5000/foo:1", "[::1]:5000/foo:1"),
            ("registry-1.docker.io/x/y:z", "docker.io/x/y:z"),
            ("docker.io/busybox", "docker.io/library/busybox:latest"),
            (
                "Example.COM/a_b/c-d__e.f:V1.0-rc_1",
                "Example.COM/a_b/c-d__e.f:V1.0-rc_1",
            ),
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
            "bad_host:/x",
            "host:port/x",
            "a/b//c",
            "a/-b",
            "busybox:.tag",
        ] {
            let err = ImageRef::parse(bad).expect_err(bad);
            assert!(err.to_string().contains("invalid image reference"), "{err}");
        }
    }
}
