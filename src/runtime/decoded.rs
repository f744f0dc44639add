//! Protobuf forms a record caches while it is in memory: a message it keeps hex-encoded,
//! decoded once ([`Decoded`]), and a message made from it, encoded once ([`Encoded`]).
//!
//! A clone starts empty: records are cloned to be changed, and a changed record may hold
//! another message (shared records in the store's table are not cloned, so they keep theirs).

use std::sync::{Arc, OnceLock};

/// The decoded form of a record's hex-encoded message (empty until first asked for).
#[derive(Debug)]
pub struct Decoded<T>(OnceLock<Arc<T>>);

impl<T> Default for Decoded<T> {
    fn default() -> Self {
        Self(OnceLock::new())
    }
}

impl<T> Clone for Decoded<T> {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl<T: prost::Message + Default> Decoded<T> {
    /// The message `hex` holds (the default message if it does not decode), decoded on the
    /// first call only.
    pub fn get(&self, hex: &str) -> &T {
        self.0.get_or_init(|| {
            Arc::new(
                hex::decode(hex)
                    .ok()
                    .and_then(|b| T::decode(b.as_slice()).ok())
                    .unwrap_or_default(),
            )
        })
    }
}

/// The encoding of a message made from its record (empty until first asked for).
#[derive(Debug, Default)]
pub struct Encoded(OnceLock<bytes::Bytes>);

impl Clone for Encoded {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl Encoded {
    /// The encoding of the message `make` returns, made on the first call only.
    pub fn get<M: prost::Message>(&self, make: impl FnOnce() -> M) -> &bytes::Bytes {
        self.0
            .get_or_init(|| bytes::Bytes::from(make().encode_to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_cri::v1 as cri;
    use prost::Message;

    #[test]
    fn decodes_once_and_survives_garbage() {
        let config = cri::PodSandboxConfig {
            hostname: "h".into(),
            ..Default::default()
        };
        let hex = hex::encode(config.encode_to_vec());
        let d = Decoded::<cri::PodSandboxConfig>::default();
        assert_eq!(d.get(&hex).hostname, "h");
        // Decoded once: a later, different text is not read again.
        assert_eq!(d.get("").hostname, "h");
        // A clone decodes afresh (its record may have changed).
        let other = cri::PodSandboxConfig {
            hostname: "other".into(),
            ..Default::default()
        };
        assert_eq!(
            d.clone().get(&hex::encode(other.encode_to_vec())).hostname,
            "other"
        );
        let bad = Decoded::<cri::PodSandboxConfig>::default();
        assert_eq!(bad.get("zz").hostname, "");
    }

    #[test]
    fn encodes_once_and_a_clone_afresh() {
        let item = |id: &str| cri::PodSandbox {
            id: id.into(),
            ..Default::default()
        };
        let e = Encoded::default();
        assert_eq!(e.get(|| item("a")).as_ref(), item("a").encode_to_vec());
        // Encoded once: a later, different message is not encoded again.
        assert_eq!(e.get(|| item("b")).as_ref(), item("a").encode_to_vec());
        assert_eq!(
            e.clone().get(|| item("b")).as_ref(),
            item("b").encode_to_vec()
        );
    }
}
