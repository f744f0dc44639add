//! The overlayfs snapshotter: snapshot directories, crash-safe metadata and mount generation.
//!
//! # On-disk layout
//!
//! ```text
//! <root>/metadata.redb          records, parent→children index, id counter
//! <root>/snapshots/<id>/fs      the snapshot's own files (overlay upper dir or layer content)
//! <root>/snapshots/<id>/work    overlay work dir
//! ```
//!
//! `<id>` is a short decimal number from a counter in the metadata, so that overlay mount
//! options for deep chains stay short.
//!
//! # Crash-safety invariant
//!
//! **Every record in the metadata points at a complete directory; a directory may exist
//! without a record, never the reverse.**
//!
//! * Creating: inside one write transaction the id is allocated, the directory is built as
//!   `snapshots/new-<id>`, made durable, renamed to `snapshots/<id>` (and the rename made durable),
//!   and only then is the record inserted and the transaction committed. A crash before the commit
//!   leaves a directory that no record names.
//! * Removing: the record is deleted in one committed transaction first; then the directory is
//!   renamed to `snapshots/rm-<id>` and deleted. A crash in between leaves a directory that no
//!   record names.
//! * [`Snapshotter::open`] deletes every entry under `snapshots/` that is not the directory of a
//!   recorded snapshot (`new-*`, `rm-*`, ids without a record, stray files).
//!
//! A snapshot with children is never removed: the children index is checked in the same write
//! transaction that deletes the record, and a parent is validated in the transaction that adds a
//! child, so the two cannot race. Ids are never reused (the counter only grows).

use std::collections::{BTreeMap, HashSet};
use std::fs::{DirBuilder, File};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::{
    MultimapTableDefinition, ReadableMultimapTable, ReadableTable, TableDefinition,
    WriteTransaction,
};

use crate::db::MetadataDb;
use serde::{Deserialize, Serialize};

use crate::error::{DbContext, Error, IoContext, Result};
use crate::mount::Mount;
use crate::usage::{Usage, disk_usage};

/// Snapshot records by key (Active, View) or name (Committed): JSON-encoded [`Record`].
const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
/// Parent key → child keys.
const CHILDREN: MultimapTableDefinition<&str, &str> = MultimapTableDefinition::new("children");
/// Counters and format version.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

const META_NEXT_ID: &str = "next_id";
const META_VERSION: &str = "version";
const FORMAT_VERSION: u64 = 1;

const DB_FILE: &str = "metadata.redb";
const SNAPSHOTS_DIR: &str = "snapshots";
const FS_DIR: &str = "fs";
const WORK_DIR: &str = "work";
const NEW_PREFIX: &str = "new-";
const RM_PREFIX: &str = "rm-";

/// Mount data longer than this switches overlays to paths relative to `snapshots/`; the kernel
/// limit is one page (4096 bytes) including the terminating NUL, and callers may add options.
const MAX_OPTIONS_LEN: usize = 4000;
/// Longest parent chain followed; overlayfs itself stacks at most 500 layers.
const MAX_CHAIN: usize = 4096;

/// What a snapshot is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A read-only view of a committed snapshot chain; cannot be committed.
    View,
    /// A writable snapshot; can be committed.
    Active,
    /// Immutable content that other snapshots can use as their parent.
    Committed,
}

/// Metadata of one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    /// The key (Active, View) or committed name.
    pub name: String,
    /// The committed snapshot this one is built on.
    pub parent: Option<String>,
    /// What the snapshot is.
    pub kind: Kind,
    /// Numeric id; the directory is `snapshots/<id>`.
    pub id: u64,
    /// Free-form labels.
    pub labels: BTreeMap<String, String>,
    /// When the snapshot was created (for a committed one: when it was committed).
    pub created: SystemTime,
}

/// The stored form of a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    id: u64,
    kind: Kind,
    parent: Option<String>,
    labels: BTreeMap<String, String>,
    created_secs: u64,
    created_nanos: u32,
}

impl Record {
    fn new(id: u64, kind: Kind, parent: Option<String>, labels: BTreeMap<String, String>) -> Self {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Record {
            id,
            kind,
            parent,
            labels,
            created_secs: since.as_secs(),
            created_nanos: since.subsec_nanos(),
        }
    }

    fn info(self, name: &str) -> Info {
        Info {
            name: name.to_string(),
            parent: self.parent,
            kind: self.kind,
            id: self.id,
            labels: self.labels,
            created: UNIX_EPOCH + Duration::new(self.created_secs, self.created_nanos),
        }
    }

    fn encode(&self, key: &str) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(|source| Error::Corrupt {
            key: key.to_string(),
            source,
        })
    }

    fn decode(key: &str, bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|source| Error::Corrupt {
            key: key.to_string(),
            source,
        })
    }
}

/// Reads one record from a snapshots table (read or write transaction).
fn load<T>(table: &T, key: &str) -> Result<Option<Record>>
where
    T: ReadableTable<&'static str, &'static [u8]>,
{
    let guard = table.get(key).db(|| format!("read snapshot {key:?}"))?;
    guard.map(|g| Record::decode(key, g.value())).transpose()
}

/// Ids of the ancestors of `record`, nearest parent first.
fn ancestor_ids<T>(table: &T, key: &str, record: &Record) -> Result<Vec<u64>>
where
    T: ReadableTable<&'static str, &'static [u8]>,
{
    let mut ids = Vec::new();
    let mut next = record.parent.clone();
    while let Some(parent) = next {
        if ids.len() >= MAX_CHAIN {
            return Err(Error::InvalidState(
                key.to_string(),
                format!("parent chain longer than {MAX_CHAIN}"),
            ));
        }
        let rec = load(table, &parent)?.ok_or_else(|| {
            Error::InvalidState(
                key.to_string(),
                format!("ancestor {parent:?} is missing from the metadata"),
            )
        })?;
        ids.push(rec.id);
        next = rec.parent;
    }
    Ok(ids)
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::InvalidState(
            key.to_string(),
            "snapshot keys must not be empty".to_string(),
        ));
    }
    Ok(())
}

/// How [`Snapshotter::commit_inner`] picks the committed snapshot's parent.
enum CommitParent<'a> {
    /// Keep the parent the active snapshot was prepared with.
    Keep,
    /// Use this parent (the active snapshot must have had none, or the same one).
    Set(Option<&'a str>),
}

/// An overlayfs snapshotter rooted at one directory. All methods take `&self`; it is
/// `Send + Sync`, and metadata changes are serialised by the database's write transactions.
pub struct Snapshotter {
    root: PathBuf,
    snapshots: PathBuf,
    /// Whether overlay paths must always be relative (the root has characters that overlay
    /// option parsing treats specially).
    always_relative: bool,
    db: MetadataDb,
}

impl std::fmt::Debug for Snapshotter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshotter")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl Snapshotter {
    /// Opens (creating if needed) a snapshotter at `root` and deletes leftovers of interrupted
    /// operations. Only one `Snapshotter` at a time can have a given root open.
    pub fn open(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root).io(|| "create snapshotter root".to_string(), root)?;
        let root = root
            .canonicalize()
            .io(|| "resolve snapshotter root".to_string(), root)?;
        let Some(root_str) = root.to_str() else {
            return Err(Error::io(
                "snapshotter root must be valid UTF-8",
                &root,
                std::io::ErrorKind::InvalidInput.into(),
            ));
        };
        let always_relative = root_str.contains([',', ':', '\\', '"', '\n']);
        let snapshots = root.join(SNAPSHOTS_DIR);
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&snapshots)
            .io(|| "create snapshots directory".to_string(), &snapshots)?;
        let db_path = root.join(DB_FILE);
        let db = MetadataDb::open(&db_path).db(|| format!("open {}", db_path.display()))?;
        let this = Snapshotter {
            root,
            snapshots,
            always_relative,
            db,
        };
        let known = this.init_metadata()?;
        this.remove_leftovers(&known)?;
        Ok(this)
    }

    /// Creates the tables, checks the format and the id counter; returns the recorded ids.
    fn init_metadata(&self) -> Result<HashSet<u64>> {
        let ctx = || "initialise metadata".to_string();
        let txn = self.db.begin_write().db(ctx)?;
        let mut ids = HashSet::new();
        {
            let mut meta = txn.open_table(META).db(ctx)?;
            let version = meta.get(META_VERSION).db(ctx)?.map(|g| g.value());
            match version {
                None => {
                    meta.insert(META_VERSION, FORMAT_VERSION).db(ctx)?;
                }
                Some(FORMAT_VERSION) => {}
                Some(other) => {
                    return Err(Error::io(
                        format!("unsupported snapshot metadata format {other}"),
                        self.root.join(DB_FILE),
                        std::io::ErrorKind::InvalidData.into(),
                    ));
                }
            }
            txn.open_multimap_table(CHILDREN).db(ctx)?;
            let snaps = txn.open_table(SNAPSHOTS).db(ctx)?;
            for entry in snaps.iter().db(ctx)? {
                let (key, value) = entry.db(ctx)?;
                let rec = Record::decode(key.value(), value.value())?;
                ids.insert(rec.id);
            }
            let next = meta.get(META_NEXT_ID).db(ctx)?.map_or(1, |g| g.value());
            let floor = ids.iter().max().map_or(1, |max| max + 1);
            if next < floor {
                tracing::warn!(
                    next,
                    floor,
                    "snapshot id counter behind recorded ids, raising it"
                );
                meta.insert(META_NEXT_ID, floor).db(ctx)?;
            } else if meta.get(META_NEXT_ID).db(ctx)?.is_none() {
                meta.insert(META_NEXT_ID, next).db(ctx)?;
            }
        }
        txn.commit().db(ctx)?;
        Ok(ids)
    }

    /// Deletes everything under `snapshots/` that is not a recorded snapshot's directory
    /// (failures to delete are logged, not returned).
    fn remove_leftovers(&self, known: &HashSet<u64>) -> Result<()> {
        let ctx = || "scan snapshots directory".to_string();
        let mut present = HashSet::new();
        for entry in std::fs::read_dir(&self.snapshots).io(ctx, &self.snapshots)? {
            let entry = entry.io(ctx, &self.snapshots)?;
            let name = entry.file_name();
            let id = name.to_str().and_then(|n| n.parse::<u64>().ok());
            // Only canonical decimal names ("12", not "012") are snapshot directories.
            let canonical = id.is_some_and(|id| name.to_str() == Some(id.to_string().as_str()));
            if let Some(id) = id.filter(|id| canonical && known.contains(id)) {
                present.insert(id);
                continue;
            }
            let path = entry.path();
            tracing::info!(path = %path.display(), "removing leftover from an interrupted snapshot operation");
            let removed = remove_any(&path);
            // Not fatal: an unrecorded directory is never used, and `create_dir` clears one
            // that happens to sit at a newly allocated id.
            if let Err(e) = removed {
                tracing::warn!(path = %path.display(), error = %e, "could not remove snapshot leftover");
            }
        }
        for id in known.difference(&present) {
            tracing::error!(id, "recorded snapshot has no directory");
        }
        Ok(())
    }

    /// The canonical root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory holding every snapshot's directory (the paths in overlay mount options
    /// are below it).
    pub fn snapshots_dir(&self) -> &Path {
        &self.snapshots
    }

    fn dir(&self, id: u64) -> PathBuf {
        self.snapshots.join(id.to_string())
    }

    fn fs_dir(&self, id: u64) -> PathBuf {
        self.dir(id).join(FS_DIR)
    }

    /// Prepares a writable (Active) snapshot on `parent`, which must be Committed. Returns the
    /// mounts that show it; nothing is mounted.
    pub fn prepare(
        &self,
        key: &str,
        parent: Option<&str>,
        labels: BTreeMap<String, String>,
    ) -> Result<Vec<Mount>> {
        self.create(key, parent, Kind::Active, labels)
    }

    /// Creates a read-only (View) snapshot of `parent`, which must be Committed. Returns the
    /// mounts that show it; nothing is mounted.
    pub fn view(
        &self,
        key: &str,
        parent: Option<&str>,
        labels: BTreeMap<String, String>,
    ) -> Result<Vec<Mount>> {
        self.create(key, parent, Kind::View, labels)
    }

    fn create(
        &self,
        key: &str,
        parent: Option<&str>,
        kind: Kind,
        labels: BTreeMap<String, String>,
    ) -> Result<Vec<Mount>> {
        check_key(key)?;
        let ctx = || format!("create snapshot {key:?}");
        let txn = self.db.begin_write().db(ctx)?;
        let (id, ancestors) = {
            let mut snaps = txn.open_table(SNAPSHOTS).db(ctx)?;
            if load(&snaps, key)?.is_some() {
                return Err(Error::AlreadyExists(key.to_string()));
            }
            if let Some(parent) = parent {
                let prec =
                    load(&snaps, parent)?.ok_or_else(|| Error::NotFound(parent.to_string()))?;
                if prec.kind != Kind::Committed {
                    return Err(Error::InvalidState(
                        parent.to_string(),
                        format!("cannot be the parent of {key:?}: it is not committed"),
                    ));
                }
            }
            let id = self.allocate_id(&txn, key)?;
            let record = Record::new(id, kind, parent.map(str::to_string), labels);
            let ancestors = ancestor_ids(&snaps, key, &record)?;
            self.create_dir(key, id)?;
            let inserted = (|| {
                snaps.insert(key, record.encode(key)?.as_slice()).db(ctx)?;
                if let Some(parent) = parent {
                    let mut children = txn.open_multimap_table(CHILDREN).db(ctx)?;
                    children.insert(parent, key).db(ctx)?;
                }
                Ok::<_, Error>(())
            })();
            if let Err(e) = inserted {
                self.discard_dir(id);
                return Err(e);
            }
            (id, ancestors)
        };
        if let Err(e) = txn.commit().db(ctx) {
            self.discard_dir(id);
            return Err(e);
        }
        tracing::debug!(key, id, ?parent, ?kind, "created snapshot");
        Ok(self.mounts_for(kind, id, &ancestors))
    }

    fn allocate_id(&self, txn: &WriteTransaction, key: &str) -> Result<u64> {
        let ctx = || format!("allocate id for snapshot {key:?}");
        let mut meta = txn.open_table(META).db(ctx)?;
        let id = meta.get(META_NEXT_ID).db(ctx)?.map_or(1, |g| g.value());
        meta.insert(META_NEXT_ID, id + 1).db(ctx)?;
        Ok(id)
    }

    /// Builds `snapshots/<id>` (via `new-<id>`) durably.
    fn create_dir(&self, key: &str, id: u64) -> Result<()> {
        let ctx = || format!("create directory of snapshot {key:?}");
        let tmp = self.snapshots.join(format!("{NEW_PREFIX}{id}"));
        let dir = self.dir(id);
        // Ids are never reused, so anything here is an unrecorded leftover.
        for stale in [&tmp, &dir] {
            if stale.symlink_metadata().is_ok() {
                tracing::warn!(path = %stale.display(), "removing stale snapshot directory");
                remove_any(stale).io(ctx, stale)?;
            }
        }
        let built = (|| {
            DirBuilder::new().mode(0o700).create(&tmp).io(ctx, &tmp)?;
            let fs = tmp.join(FS_DIR);
            DirBuilder::new().mode(0o755).create(&fs).io(ctx, &fs)?;
            // The umask may have narrowed the mode; the fs dir is the image root's directory.
            std::fs::set_permissions(&fs, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .io(ctx, &fs)?;
            let work = tmp.join(WORK_DIR);
            DirBuilder::new().mode(0o700).create(&work).io(ctx, &work)?;
            sync_dir(&tmp).io(ctx, &tmp)?;
            std::fs::rename(&tmp, &dir).io(ctx, &tmp)?;
            sync_dir(&self.snapshots).io(ctx, &self.snapshots)
        })();
        if built.is_err() {
            for path in [&tmp, &dir] {
                if path.symlink_metadata().is_ok() {
                    let _ = std::fs::remove_dir_all(path);
                }
            }
        }
        built
    }

    /// Best-effort removal of a directory whose record was never committed; `open` retries.
    fn discard_dir(&self, id: u64) {
        let dir = self.dir(id);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            tracing::warn!(path = %dir.display(), error = %e, "could not remove unrecorded snapshot directory");
        }
    }

    /// The mounts of an existing snapshot. For a Committed one these show its content
    /// read-only, as a View on it would.
    pub fn mounts(&self, key: &str) -> Result<Vec<Mount>> {
        let ctx = || format!("mounts of snapshot {key:?}");
        let txn = self.db.begin_read().db(ctx)?;
        let snaps = txn.open_table(SNAPSHOTS).db(ctx)?;
        let rec = load(&snaps, key)?.ok_or_else(|| Error::NotFound(key.to_string()))?;
        let ancestors = ancestor_ids(&snaps, key, &rec)?;
        Ok(match rec.kind {
            Kind::Committed => {
                let mut chain = vec![rec.id];
                chain.extend(ancestors);
                self.view_mounts(&chain)
            }
            kind => self.mounts_for(kind, rec.id, &ancestors),
        })
    }

    fn mounts_for(&self, kind: Kind, id: u64, ancestors: &[u64]) -> Vec<Mount> {
        match kind {
            Kind::Active if ancestors.is_empty() => vec![self.bind(id, "rw")],
            Kind::Active => self.overlay(ancestors, Some(id)),
            Kind::View | Kind::Committed if ancestors.is_empty() => vec![self.bind(id, "ro")],
            Kind::View | Kind::Committed => self.view_mounts(ancestors),
        }
    }

    /// Read-only mounts of the layers `chain` (nearest first, non-empty).
    fn view_mounts(&self, chain: &[u64]) -> Vec<Mount> {
        match chain {
            [single] => vec![self.bind(*single, "ro")],
            _ => self.overlay(chain, None),
        }
    }

    fn bind(&self, id: u64, mode: &str) -> Mount {
        Mount {
            fstype: "bind".to_string(),
            source: self.fs_dir(id).to_string_lossy().into_owned(),
            options: vec!["rbind".to_string(), mode.to_string()],
            cwd: None,
        }
    }

    /// An overlay of `lowers` (nearest first), writable into `upper` when given.
    fn overlay(&self, lowers: &[u64], upper: Option<u64>) -> Vec<Mount> {
        let build = |base: &str| {
            let lowerdir = lowers
                .iter()
                .map(|id| format!("{base}{id}/{FS_DIR}"))
                .collect::<Vec<_>>()
                .join(":");
            let mut options = Vec::with_capacity(4);
            if upper.is_none() {
                options.push("ro".to_string());
            }
            options.push("index=off".to_string());
            options.push(format!("lowerdir={lowerdir}"));
            if let Some(id) = upper {
                options.push(format!("upperdir={base}{id}/{FS_DIR}"));
                options.push(format!("workdir={base}{id}/{WORK_DIR}"));
            }
            options
        };
        let absolute = build(&format!("{}/", self.snapshots.to_string_lossy()));
        let length = absolute.iter().map(|o| o.len() + 1).sum::<usize>();
        let (options, cwd) = if self.always_relative || length > MAX_OPTIONS_LEN {
            (build(""), Some(self.snapshots.clone()))
        } else {
            (absolute, None)
        };
        vec![Mount {
            fstype: "overlay".to_string(),
            source: "overlay".to_string(),
            options,
            cwd,
        }]
    }

    /// Commits the Active snapshot `key` as `name`, keeping its parent. The directory is reused
    /// (no copy); the committed snapshot's labels are `labels` (the active's are dropped).
    pub fn commit(&self, name: &str, key: &str, labels: BTreeMap<String, String>) -> Result<()> {
        self.commit_inner(name, key, CommitParent::Keep, labels)
    }

    /// Commits the Active snapshot `key` as `name` on top of `parent`, which must be Committed.
    ///
    /// This serves parallel unpacking: every layer is unpacked into its own Active snapshot
    /// prepared without a parent, then they are committed in chain order, each onto the
    /// previous. An active snapshot prepared with a parent can only be committed onto that
    /// same parent.
    pub fn commit_with_parent(
        &self,
        name: &str,
        key: &str,
        parent: Option<&str>,
        labels: BTreeMap<String, String>,
    ) -> Result<()> {
        self.commit_inner(name, key, CommitParent::Set(parent), labels)
    }

    fn commit_inner(
        &self,
        name: &str,
        key: &str,
        parent: CommitParent<'_>,
        labels: BTreeMap<String, String>,
    ) -> Result<()> {
        check_key(name)?;
        let ctx = || format!("commit snapshot {key:?} as {name:?}");
        let txn = self.db.begin_write().db(ctx)?;
        {
            let mut snaps = txn.open_table(SNAPSHOTS).db(ctx)?;
            let mut children = txn.open_multimap_table(CHILDREN).db(ctx)?;
            let rec = load(&snaps, key)?.ok_or_else(|| Error::NotFound(key.to_string()))?;
            match rec.kind {
                Kind::Active => {}
                Kind::View => {
                    return Err(Error::InvalidState(
                        key.to_string(),
                        "a view cannot be committed".to_string(),
                    ));
                }
                Kind::Committed => {
                    return Err(Error::InvalidState(
                        key.to_string(),
                        "already committed".to_string(),
                    ));
                }
            }
            if name != key && load(&snaps, name)?.is_some() {
                return Err(Error::AlreadyExists(name.to_string()));
            }
            let new_parent = match parent {
                CommitParent::Keep => rec.parent.clone(),
                CommitParent::Set(wanted) => {
                    if let Some(old) = &rec.parent
                        && Some(old.as_str()) != wanted
                    {
                        return Err(Error::InvalidState(
                            key.to_string(),
                            format!(
                                "prepared on parent {old:?}, cannot be committed onto {wanted:?}"
                            ),
                        ));
                    }
                    if let Some(p) = wanted {
                        let prec =
                            load(&snaps, p)?.ok_or_else(|| Error::NotFound(p.to_string()))?;
                        if prec.kind != Kind::Committed {
                            return Err(Error::InvalidState(
                                p.to_string(),
                                format!("cannot be the parent of {name:?}: it is not committed"),
                            ));
                        }
                    }
                    wanted.map(str::to_string)
                }
            };
            if let Some(old) = &rec.parent {
                children.remove(old.as_str(), key).db(ctx)?;
            }
            snaps.remove(key).db(ctx)?;
            let committed = Record::new(rec.id, Kind::Committed, new_parent.clone(), labels);
            snaps
                .insert(name, committed.encode(name)?.as_slice())
                .db(ctx)?;
            if let Some(p) = &new_parent {
                children.insert(p.as_str(), name).db(ctx)?;
            }
        }
        txn.commit().db(ctx)?;
        tracing::debug!(key, name, "committed snapshot");
        Ok(())
    }

    /// Removes a snapshot and its directory. Fails with [`Error::InUse`] if it has children.
    pub fn remove(&self, key: &str) -> Result<()> {
        if let Some(doomed) = self.detach(key)?
            && let Err(e) = std::fs::remove_dir_all(&doomed)
        {
            tracing::warn!(key, path = %doomed.display(), error = %e, "could not delete removed snapshot; it is retried on the next open");
        }
        Ok(())
    }

    /// Removes a snapshot's record (it must have no children) and moves its directory aside;
    /// returns where it now is, for the caller to delete when it suits it (None when the move
    /// failed). A directory nobody deleted is deleted by the next [`Snapshotter::open`].
    pub fn detach(&self, key: &str) -> Result<Option<PathBuf>> {
        let ctx = || format!("remove snapshot {key:?}");
        let txn = self.db.begin_write().db(ctx)?;
        let id = {
            let mut snaps = txn.open_table(SNAPSHOTS).db(ctx)?;
            let mut children = txn.open_multimap_table(CHILDREN).db(ctx)?;
            let rec = load(&snaps, key)?.ok_or_else(|| Error::NotFound(key.to_string()))?;
            if !children.get(key).db(ctx)?.is_empty() {
                return Err(Error::InUse(key.to_string()));
            }
            snaps.remove(key).db(ctx)?;
            if let Some(parent) = &rec.parent {
                children.remove(parent.as_str(), key).db(ctx)?;
            }
            rec.id
        };
        txn.commit().db(ctx)?;
        // The record is gone; from here on a failure only leaves garbage that `open` deletes.
        let dir = self.dir(id);
        let doomed = self.snapshots.join(format!("{RM_PREFIX}{id}"));
        if let Err(e) = std::fs::rename(&dir, &doomed) {
            tracing::warn!(key, path = %dir.display(), error = %e, "could not move removed snapshot aside");
            return Ok(None);
        }
        tracing::debug!(key, id, "removed snapshot");
        Ok(Some(doomed))
    }

    /// Metadata of one snapshot.
    pub fn stat(&self, key: &str) -> Result<Info> {
        let ctx = || format!("stat snapshot {key:?}");
        let txn = self.db.begin_read().db(ctx)?;
        let snaps = txn.open_table(SNAPSHOTS).db(ctx)?;
        let rec = load(&snaps, key)?.ok_or_else(|| Error::NotFound(key.to_string()))?;
        Ok(rec.info(key))
    }

    /// Space and inodes used by the snapshot's own directory (not its parents).
    pub fn usage(&self, key: &str) -> Result<Usage> {
        let info = self.stat(key)?;
        disk_usage(key, &self.fs_dir(info.id))
    }

    /// All snapshots, sorted by name.
    pub fn list(&self) -> Result<Vec<Info>> {
        let ctx = || "list snapshots".to_string();
        let txn = self.db.begin_read().db(ctx)?;
        let snaps = txn.open_table(SNAPSHOTS).db(ctx)?;
        let mut out = Vec::new();
        for entry in snaps.iter().db(ctx)? {
            let (key, value) = entry.db(ctx)?;
            let key = key.value();
            out.push(Record::decode(key, value.value())?.info(key));
        }
        Ok(out)
    }

    /// The directory of a snapshot's own files, of any kind (a Committed one's must not be
    /// written): to read a layer back.
    pub fn files_dir(&self, key: &str) -> Result<PathBuf> {
        Ok(self.fs_dir(self.stat(key)?.id))
    }

    /// A path beside the snapshot's files for a caller's own record about it, removed with the
    /// snapshot. `name` is a plain file name that is not one of the snapshotter's own.
    pub fn sidecar(&self, key: &str, name: &str) -> Result<PathBuf> {
        if name.is_empty()
            || name.contains('/')
            || name == FS_DIR
            || name == WORK_DIR
            || name.starts_with('.')
        {
            return Err(Error::InvalidState(
                key.to_string(),
                format!("{name:?} cannot name a file beside a snapshot"),
            ));
        }
        Ok(self.dir(self.stat(key)?.id).join(name))
    }

    /// The filesystem directory of an Active snapshot (its overlay upper dir), so that a layer
    /// can be unpacked straight into it.
    pub fn upper_dir(&self, key: &str) -> Result<PathBuf> {
        let info = self.stat(key)?;
        if info.kind != Kind::Active {
            return Err(Error::InvalidState(
                key.to_string(),
                format!(
                    "only active snapshots have a writable directory, this is {:?}",
                    info.kind
                ),
            ));
        }
        Ok(self.fs_dir(info.id))
    }
}

/// Removes a directory tree, or a single non-directory entry, without following symlinks.
fn remove_any(path: &Path) -> std::io::Result<()> {
    if path.symlink_metadata()?.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    }
}

/// Makes a directory's entries durable.
fn sync_dir(path: &Path) -> std::io::Result<()> {
    File::open(path)?.sync_all()
}
