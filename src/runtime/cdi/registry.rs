//! The CDI devices of the spec directories: every `*.json`, `*.yaml` and `*.yml` file read, a
//! later directory's device overriding an earlier one's of the same name (the default order,
//! `/etc/cdi` then `/var/run/cdi`, lets generated specs override static ones), two definitions
//! in one directory a conflict. A file that cannot be used is kept with its reason, so that a
//! device missing because of it is reported with it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::spec_file::{self, ContainerEdits, SpecFile};

/// Spec files larger than this are not read.
const MAX_SPEC_FILE: u64 = 4 << 20;

/// The devices found, by fully qualified name.
#[derive(Default)]
pub struct Registry {
    specs: Vec<(PathBuf, SpecFile)>,
    devices: HashMap<String, Found>,
    /// Files that could not be used, with the reason.
    pub unusable: Vec<(PathBuf, String)>,
}

#[derive(Clone, Copy)]
enum Found {
    At {
        spec: usize,
        device: usize,
        dir: usize,
    },
    Conflict {
        dir: usize,
    },
}

/// One device as a container gets it: its spec file's edits (applied once per file) and its own.
pub struct Resolved<'a> {
    pub name: &'a str,
    /// Index of its spec file, to apply the file's edits once.
    pub spec: usize,
    pub spec_edits: Option<&'a ContainerEdits>,
    pub edits: &'a ContainerEdits,
}

/// Why a requested device cannot be given.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("CDI device {0:?} is not a fully qualified name (vendor.com/class=name)")]
    BadName(String),
    #[error("CDI device {name:?} is not defined in {dirs}{unusable}")]
    Unknown {
        name: String,
        dirs: String,
        unusable: String,
    },
    #[error("CDI device {0:?} is defined by more than one spec file of the same directory")]
    Conflict(String),
}

impl Registry {
    /// Reads the spec files of `dirs` (missing directories are empty).
    pub fn load(dirs: &[PathBuf]) -> Self {
        let mut r = Registry::default();
        for (d, dir) in dirs.iter().enumerate() {
            for path in spec_files(dir) {
                match read(&path) {
                    Ok(spec) => r.add(d, path, spec),
                    Err(why) => {
                        tracing::warn!(file = %path.display(), "CDI spec file not used: {why}");
                        r.unusable.push((path, why));
                    }
                }
            }
        }
        r
    }

    fn add(&mut self, dir: usize, path: PathBuf, spec: SpecFile) {
        let s = self.specs.len();
        for (i, device) in spec.devices.iter().enumerate() {
            let name = format!("{}={}", spec.kind, device.name);
            let here = Found::At {
                spec: s,
                device: i,
                dir,
            };
            let entry = self.devices.entry(name).or_insert(here);
            *entry = match *entry {
                Found::At {
                    dir: d, spec: s2, ..
                } if d == dir && s2 != s => Found::Conflict { dir },
                Found::Conflict { dir: d } if d == dir => Found::Conflict { dir },
                _ => here,
            };
        }
        self.specs.push((path, spec));
    }

    /// The devices `names` (fully qualified), in order; an unknown, conflicting or malformed
    /// name is an error naming it.
    pub fn resolve<'a>(
        &'a self,
        names: &'a [String],
        dirs: &[PathBuf],
    ) -> Result<Vec<Resolved<'a>>, ResolveError> {
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            if spec_file::split_qualified(name).is_none() {
                return Err(ResolveError::BadName(name.clone()));
            }
            match self.devices.get(name) {
                Some(Found::At { spec, device, .. }) => {
                    let file = &self.specs[*spec].1;
                    out.push(Resolved {
                        name,
                        spec: *spec,
                        spec_edits: file.container_edits.as_ref(),
                        edits: &file.devices[*device].container_edits,
                    });
                }
                Some(Found::Conflict { .. }) => return Err(ResolveError::Conflict(name.clone())),
                None => {
                    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
                    let unusable = if self.unusable.is_empty() {
                        String::new()
                    } else {
                        let files: Vec<String> = self
                            .unusable
                            .iter()
                            .map(|(p, why)| format!("{}: {why}", p.display()))
                            .collect();
                        format!(" (spec files not used: {})", files.join("; "))
                    };
                    return Err(ResolveError::Unknown {
                        name: name.clone(),
                        dirs: dirs.join(", "),
                        unusable,
                    });
                }
            }
        }
        Ok(out)
    }

    /// The spec file at `index` (its path, for messages).
    pub fn spec_path(&self, index: usize) -> &Path {
        &self.specs[index].0
    }
}

/// The spec files of `dir`, sorted by name.
fn spec_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("json" | "yaml" | "yml")
            )
        })
        .collect();
    files.sort();
    files
}

fn read(path: &Path) -> Result<SpecFile, String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > MAX_SPEC_FILE {
        return Err(format!("larger than {MAX_SPEC_FILE} bytes"));
    }
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let json = path.extension().and_then(|e| e.to_str()) == Some("json");
    spec_file::parse(&text, json).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: &str, devices: &[(&str, &str)]) -> String {
        let devices: Vec<String> = devices
            .iter()
            .map(|(n, v)| format!(r#"{{"name":"{n}","containerEdits":{{"env":["V={v}"]}}}}"#))
            .collect();
        format!(
            r#"{{"cdiVersion":"0.6.0","kind":"{kind}","devices":[{}]}}"#,
            devices.join(",")
        )
    }

    fn env(r: &Resolved<'_>) -> String {
        r.edits.env.join(",")
    }

    #[test]
    fn later_directories_override_and_same_directory_duplicates_conflict() {
        let base = std::env::temp_dir().join(format!("berth-cdi-reg-{}", std::process::id()));
        let (etc, run) = (base.join("etc"), base.join("run"));
        std::fs::create_dir_all(&etc).expect("dir");
        std::fs::create_dir_all(&run).expect("dir");
        std::fs::write(
            etc.join("a.json"),
            spec("a.com/x", &[("one", "etc"), ("two", "etc")]),
        )
        .expect("write");
        std::fs::write(run.join("a.json"), spec("a.com/x", &[("two", "run")])).expect("write");
        std::fs::write(etc.join("b.json"), spec("a.com/y", &[("d", "1")])).expect("write");
        std::fs::write(etc.join("c.json"), spec("a.com/y", &[("d", "2")])).expect("write");
        std::fs::write(etc.join("broken.yaml"), "cdiVersion: [").expect("write");
        std::fs::write(etc.join("notes.txt"), "not a spec").expect("write");
        let dirs = vec![etc.clone(), run.clone()];
        let reg = Registry::load(&dirs);
        let names = vec!["a.com/x=one".to_string(), "a.com/x=two".to_string()];
        let got = reg.resolve(&names, &dirs).expect("resolve");
        assert_eq!(
            got.iter().map(env).collect::<Vec<_>>(),
            ["V=etc", "V=run"],
            "the later directory wins"
        );
        assert_eq!(reg.unusable.len(), 1, "the broken file, not the text file");
        let conflict = vec!["a.com/y=d".to_string()];
        assert!(matches!(
            reg.resolve(&conflict, &dirs),
            Err(ResolveError::Conflict(_))
        ));
        let unknown = vec!["a.com/x=three".to_string()];
        let e = reg.resolve(&unknown, &dirs).err().expect("unknown");
        let text = e.to_string();
        assert!(
            text.contains("a.com/x=three") && text.contains("broken.yaml"),
            "{text}"
        );
        let bad = vec!["three".to_string()];
        assert!(matches!(
            reg.resolve(&bad, &dirs),
            Err(ResolveError::BadName(_))
        ));
        std::fs::remove_dir_all(&base).expect("cleanup");
    }
}
