//! Overlayfs snapshotter for Berth: layered snapshots with crash-safe metadata.
//!
//! The [`Snapshotter`] manages snapshot directories and their metadata, in the style of
//! containerd's snapshotter interface, and *returns* [`Mount`] descriptions; it never mounts
//! anything itself while preparing. [`Mount::mount`] and [`unmount`] perform and undo a
//! returned mount.
//!
//! A typical image unpack prepares one Active snapshot per layer with no parent, unpacks each
//! layer into [`Snapshotter::upper_dir`] (all at once if wanted, since overlay upper
//! directories hold only a layer's diff, whiteouts included), then commits them in chain order
//! with [`Snapshotter::commit_with_parent`]. A container's root filesystem is then an Active
//! snapshot prepared on the top layer.

mod db;
mod error;
mod mount;
mod snapshotter;
mod usage;

#[cfg(test)]
mod tests;

pub use db::MetadataDb;
pub use error::{Error, Result};
pub use mount::{Mount, unmount};
pub use snapshotter::{Info, Kind, Snapshotter};
pub use usage::Usage;
