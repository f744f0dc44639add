//! Fields cri-api added after v0.32 inside messages the k8s-cri crate defines. A request's
//! are read from its bytes a second time, as a shadow message declaring only them
//! ([`DualCodec`]); a response's are written after it as a second message ([`Appended`]),
//! which the client merges into the first, as protobuf merges every occurrence of an embedded
//! message field.

use std::marker::PhantomData;

use bytes::{Buf, BufMut};
use prost::Message;
use prost::encoding::{DecodeContext, WireType};
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};

/// Two messages written one after the other: one message to the reader, with both's fields.
#[derive(Debug, Default)]
pub struct Appended<A, B>(pub A, pub B);

impl<A: Message, B: Message> Message for Appended<A, B> {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.0.encode_raw(buf);
        self.1.encode_raw(buf);
    }

    /// Reading one back fills the first (the second's fields are the first's unknown ones).
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        self.0.merge_field(tag, wire_type, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.encoded_len() + self.1.encoded_len()
    }

    fn clear(&mut self) {
        self.0.clear();
        self.1.clear();
    }
}

/// The message types a codec stands for (a function type: the codec holds none of them).
type Types<A, B, C> = fn() -> (A, B, C);

/// A codec answering with `Resp` and reading each request both as `Req` and as `Ext`.
pub struct DualCodec<Resp, Req, Ext>(PhantomData<Types<Resp, Req, Ext>>);

impl<Resp, Req, Ext> Default for DualCodec<Resp, Req, Ext> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<Resp, Req, Ext> Codec for DualCodec<Resp, Req, Ext>
where
    Resp: Message + Send + 'static,
    Req: Message + Default + Send + 'static,
    Ext: Message + Default + Send + 'static,
{
    type Encode = Resp;
    type Decode = (Req, Ext);
    type Encoder = tonic_prost::ProstEncoder<Resp>;
    type Decoder = DualDecoder<Req, Ext>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        DualDecoder(PhantomData)
    }
}

/// Decodes one request message twice.
pub struct DualDecoder<Req, Ext>(PhantomData<fn() -> (Req, Ext)>);

impl<Req: Message + Default, Ext: Message + Default> Decoder for DualDecoder<Req, Ext> {
    type Item = (Req, Ext);
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        let bytes = buf.copy_to_bytes(buf.remaining());
        let invalid = |e: prost::DecodeError| Status::internal(e.to_string());
        let req = Req::decode(bytes.clone()).map_err(invalid)?;
        let ext = Ext::decode(bytes).map_err(invalid)?;
        Ok(Some((req, ext)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::api_v136::{
        ContainerConfigExt, ContainerStatusExt, ContainerStatusResponseExt,
        CreateContainerRequestExt,
    };
    use super::*;
    use k8s_cri::v1 as cri;

    #[test]
    fn an_appended_status_field_merges_into_the_status() {
        let base = cri::ContainerStatusResponse {
            status: Some(cri::ContainerStatus {
                id: "c".into(),
                exit_code: 3,
                ..Default::default()
            }),
            ..Default::default()
        };
        let ext = ContainerStatusResponseExt {
            status: Some(ContainerStatusExt { stop_signal: 18 }),
        };
        let bytes = Appended(base.clone(), ext.clone()).encode_to_vec();
        // A v0.32 reader sees the status it always did; a v0.36 reader sees the signal too.
        assert_eq!(
            cri::ContainerStatusResponse::decode(bytes.as_slice()).expect("old"),
            base
        );
        assert_eq!(
            ContainerStatusResponseExt::decode(bytes.as_slice()).expect("new"),
            ext
        );
    }

    #[test]
    fn a_request_reads_as_both_messages() {
        // ContainerConfig with metadata (1) and, as a v0.36 client writes it, stop_signal (18).
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "web".into(),
                attempt: 1,
            }),
            ..Default::default()
        };
        let mut config_bytes = config.encode_to_vec();
        ContainerConfigExt {
            stop_signal: 18,
            ..Default::default()
        }
        .encode_raw(&mut config_bytes);
        let mut req = Vec::new();
        prost::encoding::string::encode(1, &"pod".to_string(), &mut req);
        prost::encoding::bytes::encode(2, &config_bytes, &mut req);
        let old = cri::CreateContainerRequest::decode(req.as_slice()).expect("k8s-cri");
        assert_eq!(old.pod_sandbox_id, "pod");
        assert_eq!(
            old.config.expect("config").metadata.expect("meta").name,
            "web"
        );
        let ext = CreateContainerRequestExt::decode(req.as_slice()).expect("ext");
        assert_eq!(ext.config.map(|c| c.stop_signal), Some(18));
    }
}
