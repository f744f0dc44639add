//! Reading the kubeconfig the agent joins the cluster with: the file, its current context, its
//! cluster and credentials (client certificate and key, bearer token or token file), each
//! problem named with the file it came from.

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Why the kubeconfig cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// The file cannot be read or parsed.
    #[error("kubeconfig {path}: {error}")]
    Read { path: PathBuf, error: String },
    /// No context to use.
    #[error("kubeconfig {path}: no current-context and no single context to use")]
    NoContext { path: PathBuf },
    /// The context names a cluster or user the file does not hold.
    #[error(
        "kubeconfig {path}: context {context:?} names {what} {name:?}, which the file does not define"
    )]
    Dangling {
        path: PathBuf,
        context: String,
        what: &'static str,
        name: String,
    },
    /// The user has nothing to authenticate with.
    #[error(
        "kubeconfig {path}: user {user:?} has no usable credentials (a client certificate and key, a token or a tokenFile)"
    )]
    NoCredentials { path: PathBuf, user: String },
    /// A file the kubeconfig points at cannot be read.
    #[error("kubeconfig {path}: {what} {file}: {error}")]
    File {
        path: PathBuf,
        what: &'static str,
        file: String,
        error: std::io::Error,
    },
    /// kube-rs refused the configuration.
    #[error("kubeconfig {path}: {error}")]
    Invalid { path: PathBuf, error: String },
}

/// A checked kubeconfig: the client configuration and who it authenticates as.
pub struct Loaded {
    /// The client configuration.
    pub config: kube::Config,
    /// Who the requests come from, for log lines (`user <name> (<how>)`).
    pub identity: String,
}

/// Reads and checks `path` without contacting the API server.
pub async fn load(path: &Path) -> Result<Loaded, KubeconfigError> {
    let p = path.to_path_buf();
    let kc = Kubeconfig::read_from(path).map_err(|e| KubeconfigError::Read {
        path: p.clone(),
        error: e.to_string(),
    })?;
    let context_name = match kc.current_context.clone().filter(|c| !c.is_empty()) {
        Some(c) => c,
        None if kc.contexts.len() == 1 => kc.contexts[0].name.clone(),
        None => return Err(KubeconfigError::NoContext { path: p }),
    };
    let context = kc
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.clone())
        .ok_or_else(|| KubeconfigError::NoContext { path: p.clone() })?;
    let dangling = |what, name: &str| KubeconfigError::Dangling {
        path: p.clone(),
        context: context_name.clone(),
        what,
        name: name.to_string(),
    };
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| dangling("cluster", &context.cluster))?;
    let user_name = context.user.clone().unwrap_or_default();
    let auth = kc
        .auth_infos
        .iter()
        .find(|a| a.name == user_name)
        .and_then(|a| a.auth_info.clone())
        .ok_or_else(|| dangling("user", &user_name))?;
    let readable = |what: &'static str, file: &Option<String>| -> Result<(), KubeconfigError> {
        match file {
            Some(f) => std::fs::File::open(f)
                .map(drop)
                .map_err(|error| KubeconfigError::File {
                    path: p.clone(),
                    what,
                    file: f.clone(),
                    error,
                }),
            None => Ok(()),
        }
    };
    readable("certificate-authority", &cluster.certificate_authority)?;
    readable("client-certificate", &auth.client_certificate)?;
    readable("client-key", &auth.client_key)?;
    readable("tokenFile", &auth.token_file)?;
    let has_cert = auth.client_certificate.is_some() || auth.client_certificate_data.is_some();
    let has_key = auth.client_key.is_some() || auth.client_key_data.is_some();
    let how = if has_cert && has_key {
        match &auth.client_certificate {
            Some(f) => format!("client certificate {f}"),
            None => "client certificate".to_string(),
        }
    } else if auth.token.is_some() {
        "bearer token".to_string()
    } else if let Some(f) = &auth.token_file {
        format!("token file {f}")
    } else if auth.exec.is_some() || auth.auth_provider.is_some() {
        "credential plugin".to_string()
    } else {
        return Err(KubeconfigError::NoCredentials {
            path: p,
            user: user_name,
        });
    };
    let options = KubeConfigOptions {
        context: Some(context_name),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kc, &options)
        .await
        .map_err(|e| KubeconfigError::Invalid {
            path: p.clone(),
            error: e.to_string(),
        })?;
    Ok(Loaded {
        config,
        identity: format!("user {user_name:?} ({how})"),
    })
}
