//! Manifest and config documents: media types, parsing, platform choice, chain ids.

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::ImageError;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+json";
pub const DOCKER_SCHEMA1_SIGNED: &str = "application/vnd.docker.distribution.manifest.v1+prettyjws";

/// Media types Berth asks registries for (schema 1 too, so it can be refused by name).
pub const ACCEPTED: &[&str] = &[
    OCI_INDEX,
    DOCKER_LIST,
    OCI_MANIFEST,
    DOCKER_MANIFEST,
    DOCKER_SCHEMA1_SIGNED,
    DOCKER_SCHEMA1,
];

/// The largest manifest or index Berth reads, 4 MiB: containerd refuses larger ones too, and
/// real manifests are a few KiB (an index of every platform stays far below). A larger
/// declared size is refused before the fetch; a larger body, right after it.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// The largest image config Berth reads, 8 MiB: configs carry the image's history and
/// environment, some tens of KiB in practice. A larger declared size is refused before the
/// fetch, and the fetch stops once more bytes than declared arrive.
pub const MAX_CONFIG_BYTES: u64 = 8 << 20;

/// The size `desc` declares for the `what` ("config", "manifest") of `image`, refused with
/// [`ImageError::Hostile`] when negative or above `max`.
pub fn bounded_size(
    image: &str,
    what: &str,
    desc: &Descriptor,
    max: u64,
) -> Result<u64, ImageError> {
    match u64::try_from(desc.size) {
        Ok(size) if size <= max => Ok(size),
        _ => Err(ImageError::Hostile {
            image: image.to_string(),
            reason: format!(
                "its {what} {} declares {} bytes; Berth accepts at most {max}",
                desc.digest, desc.size
            ),
        }),
    }
}

/// A content descriptor.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
}

/// A platform in an index.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
}

/// A manifest document of any supported kind.
#[derive(Debug)]
pub enum Document {
    /// An OCI index or Docker manifest list.
    Index(Vec<Descriptor>),
    /// An image manifest.
    Manifest {
        config: Descriptor,
        layers: Vec<Descriptor>,
        media_type: String,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawManifest {
    #[serde(default)]
    schema_version: i64,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
}

/// Parses a manifest body, refusing schema 1 and unknown kinds with a clear message.
pub fn parse_document(image: &str, bytes: &[u8]) -> Result<Document, ImageError> {
    let raw: RawManifest = serde_json::from_slice(bytes)
        .map_err(|e| ImageError::Corrupt(format!("manifest of {image} is not valid JSON: {e}")))?;
    let media_type = raw.media_type.clone().unwrap_or_default();
    if raw.schema_version == 1
        || media_type == DOCKER_SCHEMA1
        || media_type == DOCKER_SCHEMA1_SIGNED
    {
        return Err(ImageError::Unsupported(format!(
            "image {image} uses Docker image manifest schema 1, which Berth does not support \
             (deprecated and removed from registries; re-push it with a current client)"
        )));
    }
    if let Some(manifests) = raw.manifests {
        return Ok(Document::Index(manifests));
    }
    match (raw.config, raw.layers) {
        (Some(config), Some(layers)) => Ok(Document::Manifest {
            config,
            layers,
            media_type: if media_type.is_empty() {
                OCI_MANIFEST.into()
            } else {
                media_type
            },
        }),
        _ => Err(ImageError::Unsupported(format!(
            "manifest of {image} has unsupported media type {media_type:?}"
        ))),
    }
}

/// The host platform as OCI names it.
pub fn host_platform() -> (&'static str, Option<&'static str>) {
    match std::env::consts::ARCH {
        "x86_64" => ("amd64", None),
        "aarch64" => ("arm64", Some("v8")),
        "arm" => ("arm", Some("v7")),
        "x86" => ("386", None),
        "powerpc64" => ("ppc64le", None),
        other => (other, None),
    }
}

/// Picks the manifest for `arch`/`variant` on linux from an index.
pub fn choose_platform<'a>(
    image: &str,
    manifests: &'a [Descriptor],
    arch: &str,
    variant: Option<&str>,
) -> Result<&'a Descriptor, ImageError> {
    let candidates: Vec<&Descriptor> = manifests
        .iter()
        .filter(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        })
        .collect();
    let exact = candidates.iter().find(|m| {
        let v = m.platform.as_ref().and_then(|p| p.variant.as_deref());
        v == variant || v.is_none() || variant.is_none()
    });
    exact.or(candidates.first()).copied().ok_or_else(|| {
        let offered: Vec<String> = manifests
            .iter()
            .filter_map(|m| m.platform.as_ref())
            .map(|p| match &p.variant {
                Some(v) => format!("{}/{}/{v}", p.os, p.architecture),
                None => format!("{}/{}", p.os, p.architecture),
            })
            .collect();
        ImageError::NotFound(format!(
            "image {image} has no manifest for linux/{arch} (offers: {})",
            offered.join(", ")
        ))
    })
}

/// The parts of an image config Berth needs.
#[derive(Debug, Default, Deserialize)]
pub struct ImageConfigDoc {
    #[serde(default)]
    pub config: Option<RuntimeConfig>,
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

/// `config` of an image config.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RuntimeConfig {
    #[serde(default)]
    pub user: Option<String>,
}

/// `rootfs` of an image config.
#[derive(Debug, Default, Deserialize)]
pub struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// Parses an image config blob.
pub fn parse_config(image: &str, bytes: &[u8]) -> Result<ImageConfigDoc, ImageError> {
    let config: ImageConfigDoc = serde_json::from_slice(bytes)
        .map_err(|e| ImageError::Corrupt(format!("config of {image} is not valid JSON: {e}")))?;
    // A `User` whose id no process can take would run as root while reported as non-root.
    let user = config.config.as_ref().and_then(|c| c.user.as_deref());
    crate::runtime::spec_user::check_image_config_user(image, user)
        .map_err(ImageError::InvalidArgument)?;
    Ok(config)
}

/// Chain ids per the OCI spec: `chain[0] = diff[0]`, `chain[n] = sha256(chain[n-1] + " " + diff[n])`.
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for d in diff_ids {
        let next = match out.last() {
            None => d.clone(),
            Some(prev) => format!(
                "sha256:{}",
                hex::encode(Sha256::digest(format!("{prev} {d}").as_bytes()))
            ),
        };
        out.push(next);
    }
    out
}

/// Splits an image's `User` into (uid, username): numeric user → uid, name → username.
pub fn image_user(user: &str) -> (Option<i64>, String) {
    let user_part = user.split(':').next().unwrap_or_default();
    if user_part.is_empty() {
        return (None, String::new());
    }
    match user_part.parse::<i64>() {
        Ok(uid) => (Some(uid), String::new()),
        Err(_) => (None, user_part.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema1_is_refused_by_name() {
        let body = br#"{"schemaVersion":1,"name":"x","tag":"y","fsLayers":[]}"#;
        let err = parse_document("docker.io/x/y:1", body).expect_err("schema1");
        assert!(err.to_string().contains("schema 1"), "{err}");
    }

    #[test]
    fn platform_choice_and_missing_platform() {
        let doc = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[
          {"mediaType":"m","digest":"sha256:a","size":1,"platform":{"os":"linux","architecture":"arm","variant":"v7"}},
          {"mediaType":"m","digest":"sha256:b","size":1,"platform":{"os":"linux","architecture":"amd64"}},
          {"mediaType":"m","digest":"sha256:c","size":1,"platform":{"os":"linux","architecture":"arm64","variant":"v8"}}]}"#;
        let Document::Index(list) = parse_document("i", doc).expect("index") else {
            panic!("expected an index");
        };
        assert_eq!(
            choose_platform("i", &list, "amd64", None)
                .expect("amd64")
                .digest,
            "sha256:b"
        );
        assert_eq!(
            choose_platform("i", &list, "arm64", Some("v8"))
                .expect("arm64")
                .digest,
            "sha256:c"
        );
        let err = choose_platform("i", &list, "s390x", None).expect_err("none");
        assert!(err.to_string().contains("linux/s390x"), "{err}");
    }

    #[test]
    fn chain_ids_follow_the_spec() {
        let diffs = vec!["sha256:a".to_string(), "sha256:b".to_string()];
        let chain = chain_ids(&diffs);
        assert_eq!(chain[0], "sha256:a");
        let want = format!(
            "sha256:{}",
            hex::encode(Sha256::digest(b"sha256:a sha256:b"))
        );
        assert_eq!(chain[1], want);
    }

    #[test]
    fn declared_sizes_are_bounded() {
        let desc = |size| Descriptor {
            media_type: String::new(),
            digest: "sha256:c".into(),
            size,
            platform: None,
        };
        assert_eq!(
            bounded_size("i", "config", &desc(10), MAX_CONFIG_BYTES).expect("small"),
            10
        );
        for size in [1 << 62, -1, i64::MAX, MAX_MANIFEST_BYTES as i64 + 1] {
            let err = bounded_size("reg/i:1", "manifest", &desc(size), MAX_MANIFEST_BYTES)
                .expect_err("refused");
            let text = err.to_string();
            assert!(matches!(err, ImageError::Hostile { .. }), "{text}");
            assert!(
                text.contains("reg/i:1") && text.contains(&size.to_string()),
                "{text}"
            );
        }
    }

    #[test]
    fn users() {
        assert_eq!(image_user("1000:1000"), (Some(1000), String::new()));
        assert_eq!(image_user("app"), (None, "app".to_string()));
        assert_eq!(image_user(""), (None, String::new()));
    }
}
