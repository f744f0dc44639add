//! Overlayfs snapshotter.
