//! Fields cri-api added after v0.32 inside messages the k8s-cri crate defines. A request's
//! are read from its bytes a second time, as a shadow message declaring only them
//! ([`DualCodec`]); a response's are written after it as a second message ([`Appended`]),
//! which the client merges into the first, as protobuf merges every occurrence of an embedded
//! message field. A request the crate's type cannot read at all (a field whose type changed)
//! is made readable first ([`Readable`]).

use std::marker::PhantomData;

use bytes::{Buf, BufMut};
use k8s_cri::v1 as cri;
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
    Req: Readable + Send + 'static,
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

impl<Req: Readable, Ext: Message + Default> Decoder for DualDecoder<Req, Ext> {
    type Item = (Req, Ext);
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        let bytes = buf.copy_to_bytes(buf.remaining());
        let invalid = |e: prost::DecodeError| Status::internal(e.to_string());
        let req = match Req::decode(bytes.clone()) {
            Ok(req) => req,
            Err(e) => {
                let req = Req::repaired(&bytes)
                    .and_then(|b| Req::decode(b.as_slice()).ok())
                    .ok_or_else(|| invalid(e))?;
                tracing::info!(
                    request = std::any::type_name::<Req>(),
                    "request read once repaired (see Readable)"
                );
                req
            }
        };
        let ext = Ext::decode(bytes).map_err(invalid)?;
        Ok(Some((req, ext)))
    }
}

/// A request the crate's type may fail to read as a v0.36 client writes it.
pub trait Readable: Message + Default {
    /// The request's bytes made readable by the crate's type (None: they cannot be).
    fn repaired(_bytes: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

impl Readable for cri::CreateContainerRequest {
    /// v0.36 made `KeyValue.value` bytes, so an env value need not be UTF-8 any more, where the
    /// crate reads a string. Such a value is taken with each invalid sequence replaced by
    /// U+FFFD, which is what the process gets from containerd too (Go writes the OCI spec's env
    /// strings that way). Request field 2 is the config, its field 6 the envs, and their field
    /// 2 the value.
    fn repaired(bytes: &[u8]) -> Option<Vec<u8>> {
        let lossy =
            &mut |value: &[u8]| Some(String::from_utf8_lossy(value).into_owned().into_bytes());
        let env = &mut |kv: &[u8]| rewrite(kv, 2, lossy);
        let config = &mut |config: &[u8]| rewrite(config, 6, env);
        let repaired = rewrite(bytes, 2, config)?;
        tracing::info!(
            "CreateContainer: env values that are not UTF-8 taken with U+FFFD for their invalid bytes"
        );
        Some(repaired)
    }
}

/// `msg` with each length-delimited field `tag` replaced by what `f` makes of its bytes, every
/// other field copied as it is (None: `msg`, or what `f` was given, is no message).
fn rewrite(msg: &[u8], tag: u32, f: &mut dyn FnMut(&[u8]) -> Option<Vec<u8>>) -> Option<Vec<u8>> {
    use prost::encoding::{decode_key, decode_varint, encode_key, encode_varint, skip_field};
    let mut out = Vec::with_capacity(msg.len());
    let mut rest = msg;
    while !rest.is_empty() {
        let start = msg.len() - rest.len();
        let (field, wire_type) = decode_key(&mut rest).ok()?;
        if field == tag && wire_type == WireType::LengthDelimited {
            let len = usize::try_from(decode_varint(&mut rest).ok()?).ok()?;
            if len > rest.len() {
                return None;
            }
            let (payload, after) = rest.split_at(len);
            let new = f(payload)?;
            encode_key(field, wire_type, &mut out);
            encode_varint(new.len() as u64, &mut out);
            out.extend_from_slice(&new);
            rest = after;
        } else {
            skip_field(wire_type, field, &mut rest, DecodeContext::default()).ok()?;
            out.extend_from_slice(&msg[start..msg.len() - rest.len()]);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::api_v136::{
        ContainerConfigExt, ContainerStatusExt, ContainerStatusResponseExt,
        CreateContainerRequestExt,
    };
    use super::*;

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
            status: Some(ContainerStatusExt {
                stop_signal: 18,
                mounts: Vec::new(),
            }),
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
    fn env_values_that_are_not_utf8_are_read_with_replacement_characters() {
        let config = cri::ContainerConfig {
            envs: vec![
                cri::KeyValue {
                    key: "PLAIN".into(),
                    value: "ok".into(),
                },
                cri::KeyValue {
                    key: "BINARY".into(),
                    value: "caf_".into(),
                },
            ],
            working_dir: "/w".into(),
            ..Default::default()
        };
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: "pod".into(),
            config: Some(config),
            ..Default::default()
        };
        // Latin-1 "café", as a v0.36 client may send it: 0xe9 is no UTF-8.
        let mut bytes = req.encode_to_vec();
        let at = bytes.windows(4).position(|w| w == b"caf_").expect("value");
        bytes[at + 3] = 0xe9;
        assert!(cri::CreateContainerRequest::decode(bytes.as_slice()).is_err());
        let repaired = cri::CreateContainerRequest::repaired(&bytes).expect("repaired");
        let read = cri::CreateContainerRequest::decode(repaired.as_slice()).expect("readable");
        let config = read.config.expect("config");
        assert_eq!(config.envs[0].value, "ok");
        assert_eq!(config.envs[1].value, "caf\u{fffd}");
        assert_eq!(
            (read.pod_sandbox_id.as_str(), config.working_dir.as_str()),
            ("pod", "/w")
        );
        // Bytes that are no message are not made into one.
        assert!(cri::CreateContainerRequest::repaired(&[0x12, 0x7f, 0x01]).is_none());
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
