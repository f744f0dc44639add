//! Name reservations for sandboxes and containers, built for the kubelet's retries.
//!
//! The kubelet gives up on a CRI call after 2 minutes and retries it with the same name. A
//! retry of the same request must get the object the first call made (or is still making),
//! not "name is reserved" (containerd's most reported pod-stuck bug). A different request with
//! a taken name still fails. Requests are compared by a fingerprint of their bytes.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

/// The state of one reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Progress {
    /// The first call is still creating the object.
    Creating,
    /// The object exists.
    Created,
    /// The first call failed; the name is free again.
    Failed,
}

#[derive(Debug)]
struct Entry {
    id: String,
    fingerprint: [u8; 32],
    progress: watch::Receiver<Progress>,
}

/// What a caller may do with a name.
#[derive(Debug)]
pub enum Reservation {
    /// The name is yours: create the object with this id, then call `created` or `failed`.
    New(Ticket),
    /// The same request already made (or finished making) this object: answer with its id.
    Existing(String),
    /// Another request holds the name.
    Conflict {
        /// Id of the object that holds the name.
        id: String,
    },
}

/// Proof of a fresh reservation; if dropped without `created`, the name is released.
#[derive(Debug)]
pub struct Ticket {
    name: String,
    id: String,
    progress: watch::Sender<Progress>,
    done: bool,
}

impl Ticket {
    /// The id reserved for the new object.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The object exists: retries now get its id.
    pub fn created(mut self) {
        self.done = true;
        let _ = self.progress.send(Progress::Created);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            tracing::debug!(name = %self.name, id = %self.id, "reservation released after a failed create");
            let _ = self.progress.send(Progress::Failed);
        }
    }
}

/// Names in use, by kind of object (one registry for sandboxes, one for containers).
#[derive(Debug, Default)]
pub struct NameRegistry {
    entries: Mutex<HashMap<String, Entry>>,
}

impl NameRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an object that already exists (at start-up, from the store).
    pub fn restore(&self, name: &str, id: &str, fingerprint: [u8; 32]) {
        let (_tx, rx) = watch::channel(Progress::Created);
        self.lock().insert(
            name.to_string(),
            Entry {
                id: id.to_string(),
                fingerprint,
                progress: rx,
            },
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves `name` for a request with `fingerprint`, proposing `new_id`. A retry of a
    /// request still in progress waits for the first call to finish.
    pub async fn reserve(&self, name: &str, fingerprint: [u8; 32], new_id: &str) -> Reservation {
        loop {
            let waiting = {
                let mut entries = self.lock();
                match entries.get(name) {
                    Some(e) if *e.progress.borrow() == Progress::Failed => {
                        entries.remove(name);
                        continue;
                    }
                    Some(e) if e.fingerprint != fingerprint => {
                        return Reservation::Conflict { id: e.id.clone() };
                    }
                    Some(e) if *e.progress.borrow() == Progress::Created => {
                        return Reservation::Existing(e.id.clone());
                    }
                    Some(e) => (e.id.clone(), e.progress.clone()),
                    None => {
                        let (tx, rx) = watch::channel(Progress::Creating);
                        entries.insert(
                            name.to_string(),
                            Entry {
                                id: new_id.to_string(),
                                fingerprint,
                                progress: rx,
                            },
                        );
                        return Reservation::New(Ticket {
                            name: name.to_string(),
                            id: new_id.to_string(),
                            progress: tx,
                            done: false,
                        });
                    }
                }
            };
            let (id, mut rx) = waiting;
            let outcome = rx
                .wait_for(|p| *p != Progress::Creating)
                .await
                .map(|p| p.clone())
                .unwrap_or(Progress::Failed);
            if outcome == Progress::Created {
                return Reservation::Existing(id);
            }
            // The first call failed: try to take the name ourselves.
        }
    }

    /// Frees `name` if it belongs to `id` (the object was removed).
    pub fn release(&self, name: &str, id: &str) {
        let mut entries = self.lock();
        if entries.get(name).is_some_and(|e| e.id == id) {
            entries.remove(name);
        }
    }
}

/// A fingerprint stored as hex (all zeroes when it does not decode: such a record's name can
/// still be reused by a retry only with the same zero fingerprint, i.e. never by accident).
pub fn fingerprint_from_hex(hex_text: &str) -> [u8; 32] {
    let mut fp = [0u8; 32];
    if let Ok(b) = hex::decode(hex_text)
        && b.len() == 32
    {
        fp.copy_from_slice(&b);
    }
    fp
}

/// The fingerprint of a request: sha256 of its protobuf encoding.
pub fn fingerprint<M: prost::Message>(request: &M) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(request.encode_to_vec()).into()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    const A: [u8; 32] = [1; 32];
    const B: [u8; 32] = [2; 32];

    #[tokio::test]
    async fn retry_of_a_finished_create_gets_the_same_id() {
        let r = NameRegistry::new();
        let Reservation::New(t) = r.reserve("pod", A, "id1").await else {
            panic!("first reservation")
        };
        assert_eq!(t.id(), "id1");
        t.created();
        assert!(
            matches!(r.reserve("pod", A, "id2").await, Reservation::Existing(id) if id == "id1")
        );
        assert!(
            matches!(r.reserve("pod", B, "id3").await, Reservation::Conflict { id } if id == "id1")
        );
    }

    #[tokio::test]
    async fn retry_during_a_create_waits_for_it() {
        let r = Arc::new(NameRegistry::new());
        let Reservation::New(t) = r.reserve("pod", A, "id1").await else {
            panic!("first reservation")
        };
        let r2 = r.clone();
        let retry = tokio::spawn(async move { r2.reserve("pod", A, "id2").await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !retry.is_finished(),
            "the retry waits while the first call runs"
        );
        t.created();
        let got = retry.await.expect("join");
        assert!(matches!(got, Reservation::Existing(id) if id == "id1"));
    }

    #[tokio::test]
    async fn a_failed_create_frees_the_name_for_the_retry() {
        let r = Arc::new(NameRegistry::new());
        let Reservation::New(t) = r.reserve("pod", A, "id1").await else {
            panic!("first reservation")
        };
        let r2 = r.clone();
        let retry = tokio::spawn(async move { r2.reserve("pod", A, "id2").await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(t); // the first create failed
        match retry.await.expect("join") {
            Reservation::New(t) => assert_eq!(t.id(), "id2"),
            other => panic!("expected a fresh reservation, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn release_and_restore() {
        let r = NameRegistry::new();
        r.restore("c", "id9", A);
        assert!(matches!(r.reserve("c", A, "x").await, Reservation::Existing(id) if id == "id9"));
        r.release("c", "other-id");
        assert!(matches!(
            r.reserve("c", B, "x").await,
            Reservation::Conflict { .. }
        ));
        r.release("c", "id9");
        assert!(matches!(r.reserve("c", B, "x").await, Reservation::New(_)));
    }

    #[test]
    fn fingerprints_tell_requests_apart() {
        let a = k8s_cri::v1::VersionRequest {
            version: "v1".into(),
        };
        let b = k8s_cri::v1::VersionRequest {
            version: "v2".into(),
        };
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }
}
