//! What an authenticated user may do on the node server: the kubelet's mapping of a request to
//! `nodes/<subresource>` with a verb, decided by the API server (a SubjectAccessReview) and
//! cached briefly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};

use super::authn::User;
use crate::agent::cluster::Cluster;

/// How long an allowed decision is trusted.
const ALLOWED_TTL: Duration = Duration::from_secs(300);
/// How long a denied decision is trusted.
const DENIED_TTL: Duration = Duration::from_secs(30);
/// Decisions kept at most.
const CACHE_MAX: usize = 4096;

/// What a request asks to do, in the API server's terms.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Action {
    pub verb: &'static str,
    pub subresource: &'static str,
}

/// The kubelet's mapping: the HTTP method gives the verb, the path's first part the
/// subresource of the node (`stats`, `metrics`, `log` for `/logs`, `spec`, else `proxy`).
pub fn action(method: &Method, path: &str) -> Action {
    let verb = match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "get",
    };
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    let subresource = match first {
        "stats" => "stats",
        "metrics" => "metrics",
        "logs" => "log",
        "spec" => "spec",
        _ => "proxy",
    };
    Action { verb, subresource }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied(pub String);

type Key = (String, Vec<String>, Action);
/// A decision and when it was made.
type Decision = (Result<(), Denied>, Instant);

/// Decides requests.
pub struct Authorizer {
    cluster: Option<Arc<Cluster>>,
    node: String,
    decisions: Mutex<HashMap<Key, Decision>>,
}

impl Authorizer {
    /// Asks `cluster`'s API server; with none, every authenticated user (a holder of a client
    /// certificate from the configured CA) may do everything.
    pub fn new(cluster: Option<Arc<Cluster>>, node: String) -> Self {
        Self {
            cluster,
            node,
            decisions: Mutex::new(HashMap::new()),
        }
    }

    /// Ok when `user` may do `action` on this node.
    pub async fn authorize(&self, user: &User, action: &Action) -> Result<(), Denied> {
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        let key = (user.name.clone(), user.groups.clone(), action.clone());
        {
            let map = self.decisions.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((d, at)) = map.get(&key) {
                let ttl = if d.is_ok() { ALLOWED_TTL } else { DENIED_TTL };
                if at.elapsed() < ttl {
                    return d.clone();
                }
            }
        }
        let refused = || {
            format!(
                "Forbidden (user={}, verb={}, resource=nodes, subresource={})",
                user.name, action.verb, action.subresource
            )
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(action.verb.to_string()),
                    resource: Some("nodes".into()),
                    subresource: Some(action.subresource.to_string()),
                    name: Some(self.node.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(cluster.client());
        let decision = match api.create(&Default::default(), &review).await {
            Ok(r) => {
                let status = r.status.unwrap_or_default();
                if status.allowed {
                    Ok(())
                } else {
                    let why = status.reason.filter(|r| !r.is_empty());
                    Err(Denied(match why {
                        Some(r) => format!("{}: {r}", refused()),
                        None => refused(),
                    }))
                }
            }
            Err(e) => {
                // Not cached: the next request asks again.
                cluster.log_failure("SubjectAccessReview", &e);
                return Err(Denied(format!(
                    "{}: the API server could not decide: {e}",
                    refused()
                )));
            }
        };
        let mut map = self.decisions.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= CACHE_MAX {
            map.clear();
        }
        map.insert(key, (decision.clone(), Instant::now()));
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_methods_map_as_the_kubelets() {
        let a = |m: Method, p: &str| {
            let x = action(&m, p);
            (x.verb, x.subresource)
        };
        assert_eq!(a(Method::GET, "/stats/summary"), ("get", "stats"));
        assert_eq!(a(Method::GET, "/metrics/resource"), ("get", "metrics"));
        assert_eq!(a(Method::GET, "/logs/syslog"), ("get", "log"));
        assert_eq!(a(Method::GET, "/spec/"), ("get", "spec"));
        assert_eq!(a(Method::POST, "/exec/ns/p/c"), ("create", "proxy"));
        assert_eq!(a(Method::GET, "/containerLogs/ns/p/c"), ("get", "proxy"));
        assert_eq!(a(Method::GET, "/pods"), ("get", "proxy"));
        assert_eq!(a(Method::DELETE, "/x"), ("delete", "proxy"));
        assert_eq!(a(Method::HEAD, "/healthz"), ("get", "proxy"));
    }
}
