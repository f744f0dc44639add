//! Who a request to the node server comes from: a client certificate the client CA signed, or a
//! bearer token the API server vouches for (a TokenReview, cached briefly). Anonymous requests
//! are refused.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use sha2::{Digest, Sha256};

use crate::agent::cluster::Cluster;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// How long a token's review is trusted.
const TOKEN_TTL: Duration = Duration::from_secs(120);
/// How long a refused token stays refused without asking again.
const REFUSED_TTL: Duration = Duration::from_secs(10);
/// Reviews kept at most (the oldest are dropped first when full).
const CACHE_MAX: usize = 4096;

/// A token's review (None: refused) and when it was made.
type Review = (Option<User>, Instant);

/// Authenticates requests.
pub struct Authenticator {
    cluster: Option<Arc<Cluster>>,
    reviews: Mutex<HashMap<[u8; 32], Review>>,
}

impl Authenticator {
    /// Tokens are reviewed by `cluster`'s API server (none: only certificates are accepted).
    pub fn new(cluster: Option<Arc<Cluster>>) -> Self {
        Self {
            cluster,
            reviews: Mutex::new(HashMap::new()),
        }
    }

    /// The request's user: from the verified client certificate when there is one, else from
    /// its bearer token; None when it has neither or the token is refused.
    pub async fn authenticate(
        &self,
        certificate: Option<&(String, Vec<String>)>,
        headers: &HeaderMap,
    ) -> Option<User> {
        if let Some((name, groups)) = certificate {
            let mut groups = groups.clone();
            groups.push("system:authenticated".into());
            return Some(User {
                name: name.clone(),
                uid: String::new(),
                groups,
                extra: BTreeMap::new(),
            });
        }
        let token = headers
            .get(http::header::AUTHORIZATION)?
            .to_str()
            .ok()?
            .strip_prefix("Bearer ")?
            .trim();
        if token.is_empty() {
            return None;
        }
        self.review(token).await
    }

    async fn review(&self, token: &str) -> Option<User> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        {
            let map = self.reviews.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((user, at)) = map.get(&key) {
                let ttl = if user.is_some() {
                    TOKEN_TTL
                } else {
                    REFUSED_TTL
                };
                if at.elapsed() < ttl {
                    return user.clone();
                }
            }
        }
        let cluster = self.cluster.as_ref()?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(cluster.client());
        let answer = match api.create(&Default::default(), &review).await {
            Ok(r) => r,
            Err(e) => {
                // Not cached: the next request asks again.
                cluster.log_failure("TokenReview", &e);
                return None;
            }
        };
        let status = answer.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(u)) => Some(User {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            }),
            _ => {
                tracing::debug!(error = ?status.error, "node server: a bearer token was refused");
                None
            }
        };
        let mut map = self.reviews.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= CACHE_MAX {
            let now = Instant::now();
            map.retain(|_, (_, at)| now.duration_since(*at) < TOKEN_TTL);
            if map.len() >= CACHE_MAX {
                map.clear();
            }
        }
        map.insert(key, (user.clone(), Instant::now()));
        user
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_certificate_names_the_user_and_nothing_else_passes_without_a_cluster() {
        let a = Authenticator::new(None);
        let cert = ("alice".to_string(), vec!["devs".to_string()]);
        let u = a
            .authenticate(Some(&cert), &HeaderMap::new())
            .await
            .expect("user");
        assert_eq!(u.name, "alice");
        assert_eq!(u.groups, ["devs", "system:authenticated"]);
        assert_eq!(a.authenticate(None, &HeaderMap::new()).await, None);
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(a.authenticate(None, &h).await, None, "no API server to ask");
    }
}
