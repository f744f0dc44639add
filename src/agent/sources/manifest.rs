//! Static pod manifests: scanning a directory of Pod YAML/JSON files into desired pods.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// `namespace/name` of a pod.
pub type PodKey = (String, String);

/// A pod a manifest asks for.
#[derive(Debug, Clone)]
pub struct DesiredPod {
    /// The file it came from.
    pub file: PathBuf,
    /// Stable UID: a hash of the file path, namespace and name.
    pub uid: String,
    /// Hash of the pod's content (a change recreates the pod).
    pub hash: String,
    /// The pod, with namespace defaulted and UID set.
    pub pod: Pod,
    /// Fields of the manifest the Pod type does not have (ignored, as the API server's
    /// warnings say), as JSON paths.
    pub unknown_fields: Vec<String>,
}

/// The last text of each manifest file and what it parsed to: a rescan parses only files whose
/// text changed (parsing YAML is most of an idle agent's work otherwise).
#[derive(Debug, Default)]
pub struct ParseCache {
    files: HashMap<PathBuf, (String, Result<Vec<DesiredPod>, String>)>,
}

impl ParseCache {
    /// What `text` (the content of `file`) parses to, from the cache when the text is unchanged.
    fn parse(&mut self, file: &Path, text: String) -> Result<Vec<DesiredPod>, String> {
        if let Some((cached, result)) = self.files.get(file)
            && *cached == text
        {
            return result.clone();
        }
        let result = parse(file, &text).map_err(|e| e.to_string());
        self.files
            .insert(file.to_path_buf(), (text, result.clone()));
        result
    }

    /// Forgets files that are gone.
    fn retain(&mut self, present: &[PathBuf]) {
        self.files.retain(|f, _| present.contains(f));
    }
}

/// Result of one scan: the desired pods and the files that were refused.
#[derive(Debug, Default)]
pub struct Scan {
    /// Desired pods by `namespace/name`.
    pub pods: BTreeMap<PodKey, DesiredPod>,
    /// Files (or documents in them) refused, with why.
    pub errors: BTreeMap<PathBuf, String>,
}

/// Why a manifest document was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Not YAML/JSON, or not the shape of a Pod.
    #[error("does not parse: {0}")]
    Parse(String),
    /// Parsed, but not a Pod this agent can run.
    #[error("not a valid Pod: {0}")]
    Invalid(String),
}

/// Reads every manifest in `dir` (files whose names do not start with a dot, in name order).
/// A missing directory is an empty scan. A pod defined by two files belongs to the file that
/// `owners` says already has it (the file that was there first), else to the first by name;
/// the other file is refused.
pub fn scan(dir: &Path, owners: &BTreeMap<PodKey, PathBuf>, cache: &mut ParseCache) -> Scan {
    let mut out = Scan::default();
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
            .map(|e| e.path())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
        Err(e) => {
            out.errors
                .insert(dir.to_path_buf(), format!("reading directory: {e}"));
            return out;
        }
    };
    files.sort();
    cache.retain(&files);
    // Files that own a pod already are read first, so they keep it.
    files.sort_by_key(|f| !owners.values().any(|o| o == f));
    for file in files {
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                out.errors.insert(file, format!("reading: {e}"));
                continue;
            }
        };
        match cache.parse(&file, text) {
            Ok(pods) => {
                let mut errors = Vec::new();
                for p in pods {
                    let key = key_of(&p.pod);
                    if let Some(other) = out.pods.get(&key) {
                        errors.push(format!(
                            "pod {}/{} is already defined by {}",
                            key.0,
                            key.1,
                            other.file.display()
                        ));
                        continue;
                    }
                    out.pods.insert(key, p);
                }
                if !errors.is_empty() {
                    out.errors.insert(file, errors.join("; "));
                }
            }
            Err(e) => {
                out.errors.insert(file, e);
            }
        }
    }
    out
}

/// `namespace/name` of a (defaulted) pod.
pub fn key_of(pod: &Pod) -> PodKey {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Parses one file: YAML or JSON, one or more documents, each a Pod (or a v1 List of Pods).
/// One bad document refuses the whole file, so a half-read file never starts half its pods.
pub fn parse(file: &Path, text: &str) -> Result<Vec<DesiredPod>, ManifestError> {
    let mut values = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v =
            serde_json::Value::deserialize(doc).map_err(|e| ManifestError::Parse(e.to_string()))?;
        match v {
            serde_json::Value::Null => {}
            serde_json::Value::Object(ref m)
                if m.get("kind").and_then(|k| k.as_str()) == Some("List") =>
            {
                if let Some(items) = m.get("items").and_then(|i| i.as_array()) {
                    values.extend(items.iter().cloned());
                }
            }
            other => values.push(other),
        }
    }
    let mut pods = Vec::new();
    for v in values {
        pods.push(to_pod(file, v)?);
    }
    Ok(pods)
}

fn to_pod(file: &Path, v: serde_json::Value) -> Result<DesiredPod, ManifestError> {
    let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
    if kind != "Pod" {
        return Err(ManifestError::Invalid(format!(
            "kind is {kind:?}, only Pod is supported"
        )));
    }
    let api = v
        .get("apiVersion")
        .and_then(|k| k.as_str())
        .unwrap_or_default();
    if api != "v1" {
        return Err(ManifestError::Invalid(format!(
            "apiVersion is {api:?}, expected v1"
        )));
    }
    // Read from a borrow: the document itself is still needed for the unknown fields.
    let mut pod = Pod::deserialize(&v).map_err(|e| ManifestError::Parse(e.to_string()))?;
    let mut unknown_fields = Vec::new();
    if let Ok(known) = serde_json::to_value(&pod) {
        unknown(&v, &known, "", &mut unknown_fields);
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        return Err(ManifestError::Invalid("metadata.name is missing".into()));
    }
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_string());
    validate_name("metadata.name", &name)?;
    validate_name("metadata.namespace", &namespace)?;
    pod.metadata.namespace = Some(namespace.clone());
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| ManifestError::Invalid("spec is missing".into()))?;
    if spec.containers.is_empty() {
        return Err(ManifestError::Invalid("spec.containers is empty".into()));
    }
    let mut seen = std::collections::HashSet::new();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        validate_name("container name", &c.name)?;
        if !seen.insert(c.name.as_str()) {
            return Err(ManifestError::Invalid(format!(
                "container name {:?} is used twice",
                c.name
            )));
        }
        if c.image.as_deref().unwrap_or_default().is_empty() {
            return Err(ManifestError::Invalid(format!(
                "container {:?} has no image",
                c.name
            )));
        }
    }
    let mut volume_names = std::collections::HashSet::new();
    for v in spec.volumes.iter().flatten() {
        crate::agent::volumes::check_supported(v).map_err(ManifestError::Invalid)?;
        if !volume_names.insert(v.name.as_str()) {
            return Err(ManifestError::Invalid(format!(
                "volume name {:?} is used twice",
                v.name
            )));
        }
    }
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        for vm in c.volume_mounts.iter().flatten() {
            if !volume_names.contains(vm.name.as_str()) {
                return Err(ManifestError::Invalid(format!(
                    "container {:?} mounts volume {:?}, which the pod does not have",
                    c.name, vm.name
                )));
            }
        }
    }
    if let Some(p) = spec.restart_policy.as_deref()
        && !matches!(p, "Always" | "OnFailure" | "Never")
    {
        return Err(ManifestError::Invalid(format!(
            "restartPolicy {p:?} is not Always, OnFailure or Never"
        )));
    }
    // Status in a manifest means nothing: the agent owns it.
    pod.status = None;
    let hash = content_hash(&pod);
    let uid = stable_uid(file, &namespace, &name);
    pod.metadata.uid = Some(uid.clone());
    if !unknown_fields.is_empty() {
        tracing::warn!(file = %file.display(), pod = %format!("{namespace}/{name}"), fields = ?unknown_fields, "manifest: unknown fields ignored");
    }
    Ok(DesiredPod {
        file: file.to_path_buf(),
        uid,
        hash,
        pod,
        unknown_fields,
    })
}

/// The paths of `given` (the manifest) that `known` (the same document read into the Pod type
/// and written back) lacks: fields the type does not have. Explicit nulls do not count.
fn unknown(
    given: &serde_json::Value,
    known: &serde_json::Value,
    path: &str,
    out: &mut Vec<String>,
) {
    use serde_json::Value;
    match (given, known) {
        (Value::Object(g), Value::Object(k)) => {
            for (key, value) in g {
                let here = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match k.get(key) {
                    Some(kv) => unknown(value, kv, &here, out),
                    None if !value.is_null() => out.push(here),
                    None => {}
                }
            }
        }
        (Value::Array(g), Value::Array(k)) => {
            for (i, (gv, kv)) in g.iter().zip(k).enumerate() {
                unknown(gv, kv, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// DNS-label-ish names: lower-case alphanumerics, '-' and '.', at most 253 characters.
fn validate_name(what: &str, name: &str) -> Result<(), ManifestError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.']);
    if ok {
        Ok(())
    } else {
        Err(ManifestError::Invalid(format!(
            "{what} {name:?} is not a valid name (lower-case letters, digits, '-', '.')"
        )))
    }
}

/// A UUID-shaped hash of the manifest's path, namespace and name: the same manifest gets the same
/// UID across berthd restarts.
pub fn stable_uid(file: &Path, namespace: &str, name: &str) -> String {
    let mut h = Sha256::new();
    h.update(file.as_os_str().as_encoded_bytes());
    h.update([0]);
    h.update(namespace.as_bytes());
    h.update([0]);
    h.update(name.as_bytes());
    let d = hex::encode(h.finalize());
    format!(
        "{}-{}-{}-{}-{}",
        &d[0..8],
        &d[8..12],
        &d[12..16],
        &d[16..20],
        &d[20..32]
    )
}

/// Hash of the pod as parsed (a change of anything in it recreates the pod).
fn content_hash(pod: &Pod) -> String {
    let bytes = serde_json::to_vec(pod).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_named_not_fatal() {
        let pods = parse(Path::new("/m/two.yaml"), TWO).expect("parse");
        assert!(
            pods[0].unknown_fields.is_empty(),
            "{:?}",
            pods[0].unknown_fields
        );
        assert_eq!(pods[1].unknown_fields, ["spec.containers[0].unknownField"]);
    }

    #[test]
    fn rescans_reparse_only_changed_files() {
        let dir = std::env::temp_dir().join(format!("berth-manifest-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let pod = |name: &str, image: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  - {{name: c, image: {image}}}\n"
            )
        };
        std::fs::write(dir.join("a.yaml"), pod("a", "one")).expect("write");
        std::fs::write(dir.join("b.yaml"), pod("b", "one")).expect("write");
        let mut cache = ParseCache::default();
        let first = scan(&dir, &BTreeMap::new(), &mut cache);
        assert_eq!(first.pods.len(), 2, "{:?}", first.errors);
        // What a parse would never give: a file answered with it was not parsed again.
        for (_, result) in cache.files.values_mut() {
            *result = Err("cached".into());
        }
        let again = scan(&dir, &BTreeMap::new(), &mut cache);
        assert!(again.pods.is_empty(), "{:?}", again.pods.keys());
        assert_eq!(
            again.errors.get(&dir.join("a.yaml")).map(String::as_str),
            Some("cached")
        );
        assert_eq!(
            again.errors.get(&dir.join("b.yaml")).map(String::as_str),
            Some("cached")
        );
        // A rewritten file is parsed again; the unchanged one still comes from the cache.
        std::fs::write(dir.join("b.yaml"), pod("b", "two")).expect("write");
        let changed = scan(&dir, &BTreeMap::new(), &mut cache);
        assert_eq!(
            changed.errors.get(&dir.join("a.yaml")).map(String::as_str),
            Some("cached")
        );
        assert!(
            !changed.errors.contains_key(&dir.join("b.yaml")),
            "{:?}",
            changed.errors
        );
        let key = ("default".to_string(), "b".to_string());
        let hash = |s: &Scan| s.pods.get(&key).map(|p| p.hash.clone());
        assert!(hash(&changed).is_some());
        assert_ne!(hash(&first), hash(&changed));
        std::fs::remove_file(dir.join("a.yaml")).expect("remove");
        std::fs::remove_file(dir.join("b.yaml")).expect("remove");
        assert!(scan(&dir, &BTreeMap::new(), &mut cache).pods.is_empty());
        assert!(cache.files.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    const TWO: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\nspec:\n  containers:\n  - name: c\n    image: busybox\n---\n{\"apiVersion\": \"v1\", \"kind\": \"Pod\", \"metadata\": {\"name\": \"b\", \"namespace\": \"kube-system\"}, \"spec\": {\"containers\": [{\"name\": \"c\", \"image\": \"busybox\", \"unknownField\": 1}]}}\n";

    #[test]
    fn several_pods_per_file_with_stable_uids() {
        let f = Path::new("/m/two.yaml");
        let pods = parse(f, TWO).expect("parse");
        let dir = std::env::temp_dir().join(format!("berth-manifest-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("b.yaml"), TWO).expect("write");
        std::fs::write(dir.join("a.yaml"), TWO).expect("write");
        let s = scan(&dir, &BTreeMap::new(), &mut ParseCache::default());
        assert_eq!(s.pods.len(), 2);
        assert!(s.errors.contains_key(&dir.join("b.yaml")));
        let owners = s
            .pods
            .keys()
            .map(|k| (k.clone(), dir.join("b.yaml")))
            .collect();
        let s = scan(&dir, &owners, &mut ParseCache::default());
        assert!(s.errors.contains_key(&dir.join("a.yaml")), "{:?}", s.errors);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(pods.len(), 2);
        assert_eq!(key_of(&pods[0].pod), ("default".into(), "a".into()));
        assert_eq!(key_of(&pods[1].pod), ("kube-system".into(), "b".into()));
        let again = parse(f, TWO).expect("parse");
        assert_eq!(pods[0].uid, again[0].uid);
        assert_eq!(pods[0].hash, again[0].hash);
        assert_ne!(pods[0].uid, pods[1].uid);
        let changed = parse(f, &TWO.replace("image: busybox", "image: busybox:1")).expect("parse");
        assert_eq!(pods[0].uid, changed[0].uid);
        assert_ne!(pods[0].hash, changed[0].hash);
    }

    #[test]
    fn bad_documents_are_refused() {
        let f = Path::new("/m/x.yaml");
        assert!(matches!(parse(f, "{"), Err(ManifestError::Parse(_))));
        assert!(matches!(
            parse(f, "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n"),
            Err(ManifestError::Invalid(_))
        ));
        assert!(matches!(
            parse(
                f,
                "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: []}\n"
            ),
            Err(ManifestError::Invalid(_))
        ));
        assert!(matches!(
            parse(
                f,
                "apiVersion: v1\nkind: Pod\nmetadata: {name: A}\nspec: {containers: [{name: c, image: i}]}\n"
            ),
            Err(ManifestError::Invalid(_))
        ));
        assert!(matches!(
            parse(
                f,
                "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, image: i}, {name: c, image: i}]}\n"
            ),
            Err(ManifestError::Invalid(_))
        ));
    }
}
