//! One registered device plugin: the connection to its socket and the calls the agent makes on
//! it (ListAndWatch, GetPreferredAllocation, Allocate, PreStartContainer).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::Channel;

use super::DeviceError;
use super::api::device_plugin_client::DevicePluginClient;
use super::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreferredAllocationRequest,
};

/// How long a plugin's socket may take to be there and accept the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Time between two tries to connect.
const CONNECT_RETRY: Duration = Duration::from_millis(100);

/// How long Allocate and PreStartContainer may take (the kubelet's PreStartContainer bound).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A connected device plugin.
pub struct Plugin {
    /// The resource it serves.
    pub resource: String,
    /// Its socket.
    pub socket: PathBuf,
    /// What it said it needs at registration.
    pub options: DevicePluginOptions,
    client: DevicePluginClient<Channel>,
}

impl Plugin {
    /// Connects to the plugin serving `resource` on `socket`, trying again until
    /// [`CONNECT_TIMEOUT`] while the socket is not there or not yet answering (a plugin may
    /// register before it serves, as the kubelet allows). Without `options` (a plugin found in
    /// the plugin registry), the plugin is asked for them.
    pub async fn connect(
        resource: &str,
        socket: &Path,
        options: Option<DevicePluginOptions>,
    ) -> Result<Self, DeviceError> {
        let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
        let channel = loop {
            match crate::client::unix_channel(socket).await {
                Ok(channel) => break channel,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(DeviceError::Connect {
                        resource: resource.to_string(),
                        socket: socket.to_path_buf(),
                        error: e.to_string(),
                    });
                }
                Err(_) => tokio::time::sleep(CONNECT_RETRY).await,
            }
        };
        let mut plugin = Self {
            resource: resource.to_string(),
            socket: socket.to_path_buf(),
            options: options.unwrap_or_default(),
            client: DevicePluginClient::new(channel),
        };
        if options.is_none() {
            let mut client = plugin.client.clone();
            let asked = client.get_device_plugin_options(Empty {});
            plugin.options = plugin.timed("GetDevicePluginOptions", asked).await?;
        }
        Ok(plugin)
    }

    /// A plugin for `resource` on `socket` that is not connected (for tests of the manager's
    /// bookkeeping).
    #[cfg(test)]
    pub fn unconnected(resource: &str, socket: &Path) -> Self {
        let channel = tonic::transport::Endpoint::from_static("http://[::1]:1").connect_lazy();
        Self {
            resource: resource.to_string(),
            socket: socket.to_path_buf(),
            options: DevicePluginOptions::default(),
            client: DevicePluginClient::new(channel),
        }
    }

    /// Opens the plugin's stream of device lists.
    pub async fn list_and_watch(
        &self,
    ) -> Result<tonic::Streaming<ListAndWatchResponse>, DeviceError> {
        let mut client = self.client.clone();
        client
            .list_and_watch(Empty {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| self.rpc("ListAndWatch", status))
    }

    /// Asks the plugin to set up devices `ids` for one container.
    pub async fn allocate(&self, ids: &[String]) -> Result<ContainerAllocateResponse, DeviceError> {
        let mut client = self.client.clone();
        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_i_ds: ids.to_vec(),
            }],
        };
        let answer = self.timed("Allocate", client.allocate(request)).await?;
        let mut responses = answer.container_responses.into_iter();
        match (responses.next(), responses.next()) {
            (Some(one), None) => Ok(one),
            _ => Err(self.rpc(
                "Allocate",
                tonic::Status::internal("the answer is not one container's"),
            )),
        }
    }

    /// Asks the plugin which `size` of the `available` devices it would give one container.
    pub async fn preferred(
        &self,
        available: &[String],
        size: usize,
    ) -> Result<Vec<String>, DeviceError> {
        let mut client = self.client.clone();
        let request = PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available.to_vec(),
                must_include_device_i_ds: Vec::new(),
                allocation_size: i32::try_from(size).unwrap_or(i32::MAX),
            }],
        };
        let call = "GetPreferredAllocation";
        let answer = self
            .timed(call, client.get_preferred_allocation(request))
            .await?;
        let mut responses = answer.container_responses.into_iter();
        match (responses.next(), responses.next()) {
            (Some(one), None) => Ok(one.device_i_ds),
            _ => Err(self.rpc(
                call,
                tonic::Status::internal("the answer is not one container's"),
            )),
        }
    }

    /// Tells the plugin that a container holding devices `ids` is about to start.
    pub async fn pre_start(&self, ids: &[String]) -> Result<(), DeviceError> {
        let mut client = self.client.clone();
        let request = PreStartContainerRequest {
            devices_i_ds: ids.to_vec(),
        };
        self.timed("PreStartContainer", client.pre_start_container(request))
            .await?;
        Ok(())
    }

    /// Awaits `call`'s answer for at most [`CALL_TIMEOUT`].
    async fn timed<T>(
        &self,
        call: &'static str,
        answer: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, DeviceError> {
        tokio::time::timeout(CALL_TIMEOUT, answer)
            .await
            .map_err(|_| self.rpc(call, tonic::Status::deadline_exceeded("timed out")))?
            .map(tonic::Response::into_inner)
            .map_err(|status| self.rpc(call, status))
    }

    fn rpc(&self, call: &'static str, status: tonic::Status) -> DeviceError {
        DeviceError::Rpc {
            resource: self.resource.clone(),
            call,
            message: status.message().to_string(),
        }
    }
}
