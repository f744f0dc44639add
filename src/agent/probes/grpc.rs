//! gRPC probes: one `grpc.health.v1.Health/Check` call that passes only on `SERVING`.

use std::time::Duration;

use http::uri::PathAndQuery;
use tonic::transport::Endpoint;

use super::authority;

/// The full method name of the standard health check.
pub const CHECK_PATH: &str = "/grpc.health.v1.Health/Check";

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckRequest {
    /// The service asked about; empty for the server as a whole.
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResponse {
    /// A [`ServingStatus`] number.
    #[prost(enumeration = "ServingStatus", tag = "1")]
    pub status: i32,
}

/// `grpc.health.v1.HealthCheckResponse.ServingStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ServingStatus {
    /// UNKNOWN.
    Unknown = 0,
    /// SERVING: the only status a probe passes on.
    Serving = 1,
    /// NOT_SERVING.
    NotServing = 2,
    /// SERVICE_UNKNOWN (only from Watch).
    ServiceUnknown = 3,
}

/// The protobuf name of a status number, as the kubelet reports it.
pub fn status_name(status: i32) -> String {
    match ServingStatus::try_from(status) {
        Ok(ServingStatus::Unknown) => "UNKNOWN".into(),
        Ok(ServingStatus::Serving) => "SERVING".into(),
        Ok(ServingStatus::NotServing) => "NOT_SERVING".into(),
        Ok(ServingStatus::ServiceUnknown) => "SERVICE_UNKNOWN".into(),
        Err(_) => status.to_string(),
    }
}

/// The verdict on a Check answer: only SERVING passes.
pub fn verdict(status: i32) -> Result<(), String> {
    if status == ServingStatus::Serving as i32 {
        Ok(())
    } else {
        Err(format!(
            "service unhealthy (responded with {:?})",
            status_name(status)
        ))
    }
}

/// Asks the health service at `host:port` about `service`; connecting and the call share
/// `timeout`.
pub async fn check(host: &str, port: u16, service: &str, timeout: Duration) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let target = authority(host, port);
    let within = format!("{}s", timeout.as_secs());
    let connect_failed = |e: &dyn std::fmt::Display| {
        format!("timeout: failed to connect service {target:?} within {within}: {e}")
    };
    let timed_out = format!("timeout: health rpc did not complete within {within}");
    // Connecting is bounded by the deadline below (no separate connect timeout).
    let endpoint = Endpoint::from_shared(format!("http://{target}"))
        .map_err(|e| format!("invalid gRPC target {target:?}: {e}"))?;
    let channel = match tokio::time::timeout_at(deadline, endpoint.connect()).await {
        Ok(Ok(channel)) => channel,
        Ok(Err(e)) => return Err(connect_failed(&e)),
        Err(e) => return Err(connect_failed(&e)),
    };
    let mut client = tonic::client::Grpc::new(channel);
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: service.to_string(),
    });
    request.set_timeout(deadline.saturating_duration_since(tokio::time::Instant::now()));
    let call = async {
        client.ready().await.map_err(|e| connect_failed(&e))?;
        client
            .unary::<HealthCheckRequest, HealthCheckResponse, _>(
                request,
                PathAndQuery::from_static(CHECK_PATH),
                tonic_prost::ProstCodec::default(),
            )
            .await
            .map_err(|status| {
                // The client cuts a call at its deadline (as Cancelled, not DeadlineExceeded).
                if tokio::time::Instant::now() >= deadline {
                    timed_out.clone()
                } else {
                    rpc_failure(&status, &timed_out)
                }
            })
    };
    match tokio::time::timeout_at(deadline, call).await {
        Ok(Ok(response)) => verdict(response.into_inner().status),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(timed_out),
    }
}

/// What a failed Check call means, worded like the kubelet's probe messages; `timed_out` is the
/// message of a call past its deadline.
fn rpc_failure(status: &tonic::Status, timed_out: &str) -> String {
    match status.code() {
        tonic::Code::Unimplemented => format!(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
            status.message()
        ),
        tonic::Code::DeadlineExceeded => timed_out.to_string(),
        code => format!(
            "error: health rpc probe failed: {code:?}: {}",
            status.message()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_serving_passes() {
        assert_eq!(verdict(1), Ok(()));
        assert_eq!(
            verdict(2),
            Err("service unhealthy (responded with \"NOT_SERVING\")".to_string())
        );
        assert_eq!(
            verdict(0),
            Err("service unhealthy (responded with \"UNKNOWN\")".to_string())
        );
        assert_eq!(
            verdict(7),
            Err("service unhealthy (responded with \"7\")".to_string())
        );
    }

    #[tokio::test]
    async fn a_closed_port_fails_with_the_connect_message() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let err = check("127.0.0.1", port, "", Duration::from_secs(1))
            .await
            .expect_err("nothing listens");
        assert!(
            err.starts_with("timeout: failed to connect service \"127.0.0.1:"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_server_that_never_answers_fails_within_the_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // Accepts connections and holds them without a word of HTTP/2.
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((c, _)) = listener.accept().await {
                conns.push(c);
            }
        });
        let started = std::time::Instant::now();
        let err = check("127.0.0.1", port, "", Duration::from_secs(1))
            .await
            .expect_err("no answer");
        assert_eq!(err, "timeout: health rpc did not complete within 1s");
        assert!(started.elapsed() < Duration::from_millis(1900), "{err}");
        held.abort();
    }
}
