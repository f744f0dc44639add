//! Layer unpacking (placeholder until the real module lands).
use std::io::Read;
use std::path::Path;
#[derive(Debug, Clone, Copy)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}
impl Compression {
    pub fn from_media_type(m: &str) -> Option<Self> {
        if m.ends_with("gzip") {
            Some(Self::Gzip)
        } else if m.ends_with("zstd") {
            Some(Self::Zstd)
        } else if m.ends_with("tar") {
            Some(Self::None)
        } else {
            None
        }
    }
}
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("escape {entry}: {reason}")]
    Escape { entry: String, reason: String },
    #[error("io {0}")]
    Io(#[from] std::io::Error),
}
pub struct UnpackStats {
    pub entries: u64,
    pub bytes: u64,
}
pub fn unpack_layer<R: Read>(
    reader: R,
    _c: Compression,
    dest: &Path,
) -> Result<UnpackStats, UnpackError> {
    let mut a = tar::Archive::new(reader);
    a.unpack(dest)?;
    Ok(UnpackStats {
        entries: 0,
        bytes: 0,
    })
}
