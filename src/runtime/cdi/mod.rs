//! CDI (Container Device Interface) devices for CreateContainer: the devices a container names
//! (`CDI_devices`, and the `cdi.k8s.io/*` annotations device plugins and DRA drivers set),
//! resolved against the spec files of `runtime.cdi_spec_dirs` and applied to its OCI spec.

pub mod edits;
pub mod registry;
pub mod spec_file;

use std::path::PathBuf;

use k8s_cri::v1 as cri;
use oci_spec::runtime::Spec;

use spec_file::ContainerEdits;

/// The annotation prefix under which CDI devices are named (values: comma-separated names).
pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// Why a container's CDI devices cannot be given.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// A device named that is malformed, unknown or ambiguous.
    #[error(transparent)]
    Resolve(#[from] registry::ResolveError),
    /// A device's spec file asks for an edit that cannot be made.
    #[error(transparent)]
    Edit(#[from] edits::EditError),
}

/// The edits a container's CDI devices bring, in order: each spec file's own edits once, before
/// its first device's.
#[derive(Debug, Default)]
pub struct Injection {
    pieces: Vec<(String, ContainerEdits)>,
}

/// The CDI device names `config` asks for: `CDI_devices` first, then the annotations' (sorted
/// by key), each once.
pub fn requested(config: &cri::ContainerConfig) -> Vec<String> {
    let mut names: Vec<String> = config
        .cdi_devices
        .iter()
        .map(|d| d.name.trim().to_string())
        .collect();
    let mut keys: Vec<&String> = config
        .annotations
        .keys()
        .filter(|k| k.starts_with(ANNOTATION_PREFIX))
        .collect();
    keys.sort();
    for k in keys {
        names.extend(
            config.annotations[k]
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_string),
        );
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// Resolves the devices `config` asks for against the spec files of `dirs`; None when it asks
/// for none (no file is read then).
pub fn resolve(
    config: &cri::ContainerConfig,
    dirs: &[PathBuf],
) -> Result<Option<Injection>, CdiError> {
    let names = requested(config);
    if names.is_empty() {
        return Ok(None);
    }
    let reg = registry::Registry::load(dirs);
    let found = reg.resolve(&names, dirs)?;
    let mut seen_specs = std::collections::HashSet::new();
    let mut pieces = Vec::new();
    for d in found {
        if seen_specs.insert(d.spec)
            && let Some(e) = d.spec_edits
        {
            pieces.push((
                format!("CDI spec file {}", reg.spec_path(d.spec).display()),
                e.clone(),
            ));
        }
        pieces.push((format!("CDI device {}", d.name), d.edits.clone()));
    }
    Ok(Some(Injection { pieces }))
}

impl Injection {
    /// Applies the edits to `oci`.
    pub fn apply(&self, oci: &mut Spec) -> Result<(), CdiError> {
        for (source, e) in &self.pieces {
            edits::apply(oci, e, source)?;
        }
        Ok(())
    }
}
