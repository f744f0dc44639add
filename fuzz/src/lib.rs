//! The fuzz targets' harnesses: each takes the fuzzer's bytes, drives one of Berth's parsers and
//! asserts its properties. `tests/fuzz_regressions.rs` replays the stored inputs through them.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write as _};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::panic;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::mpsc;
use std::thread;

use berth::agent::sources::manifest as pod_manifests;
use berth::config::RegistryConfig;
use berth::dbus;
use berth::image::hosts;
use berth::image::manifest::{self, Document};
use berth::image::reference::{ImageRef, validate_digest};
use berth::image::unpack::{Compression, unpack_layer};
use berth::net::cache::Entry as CniCacheEntry;
use berth::net::capabilities;
use berth::net::config::NetworkConfig;
use berth::net::result::pod_ips;
use berth::runtime::shim_client::api as shim_api;
use berth::stream::portforward;
use berth::stream::remotecommand::{self, ChannelMessage};
use berth::stream::spdy::{self, Frame, HeaderCompressor, HeaderDecompressor};
use berth::stream::websocket as ws;
use bytes::Bytes;
use tokio::io::{AsyncWriteExt as _, duplex};

#[path = "../../shim/src/frame.rs"]
mod shim_frame;

/// `ImageRef::parse` and `validate_digest` on any UTF-8: a reference that parses prints as its
/// normal form, which parses to the same reference.
pub fn image_reference(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = validate_digest(text);
    let Ok(r) = ImageRef::parse(text) else {
        return;
    };
    if let Some(d) = &r.digest {
        assert!(validate_digest(d).is_ok(), "{text:?}: digest {d:?} kept");
    }
    assert!(r.tag.is_some() || r.digest.is_some(), "{text:?}: {r:?}");
    let shown = r.to_string();
    let again = ImageRef::parse(&shown)
        .unwrap_or_else(|e| panic!("{text:?} parses, its normal form does not: {e}"));
    assert_eq!(again, r, "{text:?} and its normal form {shown:?} differ");
    let _ = r.fetch_reference().to_string();
    let _ = r.tagged();
}

/// Manifest and config documents: parsing, the platform choice in an index, chain ids.
pub fn image_manifest(data: &[u8]) {
    match manifest::parse_document("fuzz.example/image:1", data) {
        Ok(Document::Index(list)) => {
            let (host_arch, host_variant) = manifest::host_platform();
            for (arch, variant) in [
                (host_arch, host_variant),
                ("amd64", None),
                ("arm64", Some("v8")),
                ("arm", Some("v7")),
                ("arm", None),
            ] {
                if let Ok(chosen) =
                    manifest::choose_platform("fuzz.example/image:1", &list, arch, variant)
                {
                    let p = chosen.platform.as_ref().expect("chosen without a platform");
                    assert!(p.os == "linux" && p.architecture == arch, "{p:?}");
                    assert!(list.iter().any(|m| std::ptr::eq(m, chosen)));
                }
            }
        }
        Ok(Document::Manifest { media_type, .. }) => assert!(!media_type.is_empty()),
        Err(_) => {}
    }
    if let Ok(config) = manifest::parse_config("fuzz.example/image:1", data) {
        if let Some(rootfs) = &config.rootfs {
            let chain = manifest::chain_ids(&rootfs.diff_ids);
            assert_eq!(chain.len(), rootfs.diff_ids.len());
            assert_eq!(chain.first(), rootfs.diff_ids.first());
        }
        if let Some(user) = config.config.and_then(|c| c.user) {
            let (uid, name) = manifest::image_user(&user);
            assert!(uid.is_none() || name.is_empty());
        }
    }
}

/// Every descriptor of a manifest or index, and a config, checked against the size bounds:
/// [`manifest::bounded_size`] accepts exactly the sizes from 0 to the bound, and its refusal
/// names the image, the digest and the declared size.
pub fn manifest_sizes(data: &[u8]) {
    const IMAGE: &str = "fuzz.example/sizes:1";
    let descriptors = match manifest::parse_document(IMAGE, data) {
        Ok(Document::Index(list)) => list
            .into_iter()
            .map(|d| (d, "manifest", manifest::MAX_MANIFEST_BYTES))
            .collect(),
        Ok(Document::Manifest { config, layers, .. }) => {
            let mut all = vec![(config, "config", manifest::MAX_CONFIG_BYTES)];
            all.extend(layers.into_iter().map(|d| (d, "layer", u64::MAX)));
            all
        }
        Err(_) => Vec::new(),
    };
    for (desc, what, max) in descriptors {
        match manifest::bounded_size(IMAGE, what, &desc, max) {
            Ok(size) => {
                assert!(
                    desc.size >= 0 && size == desc.size as u64 && size <= max,
                    "{desc:?}"
                )
            }
            Err(e) => {
                assert!(
                    desc.size < 0 || desc.size as u64 > max,
                    "{desc:?} refused: {e}"
                );
                let text = e.to_string();
                assert!(
                    matches!(e, berth::image::ImageError::Hostile { .. })
                        && text.contains(IMAGE)
                        && text.contains(&desc.digest)
                        && text.contains(&desc.size.to_string()),
                    "{text}"
                );
            }
        }
    }
    let _ = manifest::parse_config(IMAGE, data);
}

/// What the tar crate makes of a stream: each entry's header position, path and size (its data
/// read to the end), and the error that stopped it, if one did.
type TarReading = (Vec<(u64, Vec<u8>, u64)>, Option<io::Error>);

fn read_tar(stream: impl io::Read) -> TarReading {
    let mut archive = tar::Archive::new(stream);
    let mut seen = Vec::new();
    let entries = match archive.entries() {
        Ok(entries) => entries,
        Err(e) => return (seen, Some(e)),
    };
    for entry in entries {
        let mut entry = match entry {
            Ok(entry) => entry,
            Err(e) => return (seen, Some(e)),
        };
        let item = (
            entry.raw_header_position(),
            entry.path_bytes().into_owned(),
            entry.size(),
        );
        if let Err(e) = io::copy(&mut entry, &mut io::sink()) {
            return (seen, Some(e));
        }
        seen.push(item);
    }
    (seen, None)
}

/// The tar guard over any bytes: the tar crate reads the same entries through it as without
/// it, up to a refusal, and a refusal is of a header whose type is `L`, `K`, `x` or `g` and
/// whose size is above the bound.
pub fn tar_guard(data: &[u8]) {
    use berth::image::tar_guard::{self, MAX_EXTENSION_RECORD, TarGuard};
    let (plain, plain_error) = read_tar(data);
    let (guarded, guarded_error) = read_tar(TarGuard::new(data));
    assert!(
        plain.len() >= guarded.len() && plain[..guarded.len()] == guarded[..],
        "the guard changed the entries: {guarded:?} vs {plain:?}"
    );
    match guarded_error {
        None => {
            assert!(
                plain_error.is_none(),
                "only the plain read failed: {plain_error:?}"
            );
            assert_eq!(plain.len(), guarded.len());
        }
        Some(e) => match tar_guard::refusal(&e) {
            Some(refused) => {
                let at = usize::try_from(refused.offset).expect("offset");
                let block = data
                    .get(at..at + 512)
                    .expect("the refused header is in the input");
                let header = tar::Header::from_byte_slice(block);
                let kind = header.entry_type();
                assert!(
                    kind.is_gnu_longname()
                        || kind.is_gnu_longlink()
                        || kind.is_pax_local_extensions()
                        || kind.is_pax_global_extensions(),
                    "refused a {kind:?}"
                );
                assert_eq!(header.entry_size().ok(), Some(refused.size));
                assert!(refused.size > MAX_EXTENSION_RECORD);
            }
            None => assert!(
                plain_error.is_some() && plain.len() == guarded.len(),
                "only the guarded read failed: {e}"
            ),
        },
    }
}

/// A flag byte in front of a layer: the rest is a tar to gzip and unpack as a gzip layer.
pub const GZIP_FLAG: u8 = 0xff;

/// `unpack_layer` of the bytes as a tar (gzipped first when they start with [`GZIP_FLAG`]) into
/// `/t/root` of a jail whose `/` is a fresh tmpfs: afterwards nothing but `root` may exist in
/// the jail, and `/` and `/t` must be untouched (no path, hard link or symlink took the
/// unpacker out of its root).
pub fn layer_unpack(data: &[u8]) {
    let (compression, layer) = match data.split_first() {
        Some((&GZIP_FLAG, tar)) => {
            let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            z.write_all(tar).expect("gzip into memory");
            (Compression::Gzip, z.finish().expect("gzip into memory"))
        }
        _ => (Compression::None, data.to_vec()),
    };
    let (reply, answer) = mpsc::channel();
    jail()
        .send(Job {
            layer,
            compression,
            reply,
        })
        .expect("the jail thread is gone");
    if let Err(payload) = answer.recv().expect("the jail thread is gone") {
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        panic!("unpacking the layer panicked: {message}");
    }
}

/// One layer for the jail thread, and where to send how it went.
struct Job {
    layer: Vec<u8>,
    compression: Compression,
    reply: mpsc::Sender<thread::Result<()>>,
}

/// Threads whose panics are caught and reported by [`layer_unpack`] on the caller's thread:
/// the jail and the unpacker's worker.
const JAIL_THREADS: &[&str] = &["berth-fuzz-jail", "layer-unpack"];

/// The jail thread (started on first use): its own mount namespace and filesystem context,
/// chrooted into a private 64 MiB tmpfs.
fn jail() -> &'static mpsc::Sender<Job> {
    static JAIL: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    JAIL.get_or_init(|| {
        // A panic in the jail is caught there and raised again on the caller's thread, whose
        // filesystem is the host's (libFuzzer writes the crashing input from there).
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let name = thread::current().name().map(str::to_owned);
            if name.is_some_and(|n| JAIL_THREADS.contains(&n.as_str())) {
                eprintln!("{info}");
            } else {
                previous(info);
            }
        }));
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready_tx, ready) = mpsc::channel();
        thread::Builder::new()
            .name(JAIL_THREADS[0].to_owned())
            .spawn(move || {
                let entered = enter_jail();
                let ok = entered.is_ok();
                let _ = ready_tx.send(entered);
                if !ok {
                    return;
                }
                for job in queue {
                    let result =
                        panic::catch_unwind(|| unpack_in_jail(&job.layer, job.compression));
                    let _ = job.reply.send(result);
                }
            })
            .expect("start the jail thread");
        if let Err(e) = ready.recv().expect("the jail thread is gone") {
            panic!(
                "cannot set up the layer jail (needs root: a mount namespace, tmpfs, chroot): {e}"
            );
        }
        jobs
    })
}

/// Moves this thread into a private mount namespace and filesystem context, chrooted into a
/// new tmpfs; signals for the process (libFuzzer's timeout alarm, ^C) go to other threads.
fn enter_jail() -> io::Result<()> {
    use rustix::mount::{MountFlags, MountPropagationFlags, mount, mount_change};
    use rustix::thread::{UnshareFlags, unshare_unsafe};
    // SAFETY: an all-zero sigset_t is a valid value for sigemptyset to initialise.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame; the null old-mask pointer is allowed.
    let blocked = unsafe {
        libc::sigemptyset(&mut set);
        for signal in [
            libc::SIGALRM,
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ] {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    if blocked != 0 {
        return Err(io::Error::from_raw_os_error(blocked));
    }
    // SAFETY: without FILES the descriptor table stays shared; only this thread's mount
    // namespace and root/cwd change, and it never hands a path to another thread.
    unsafe { unshare_unsafe(UnshareFlags::NEWNS | UnshareFlags::FS) }?;
    mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )?;
    mount(
        "berth-fuzz",
        "/tmp",
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        c"size=64m,mode=0755",
    )?;
    rustix::process::chroot("/tmp")?;
    rustix::process::chdir("/")?;
    Ok(())
}

/// What a directory's metadata says about its changes (entries added or removed, chmod,
/// chown, xattrs, times).
fn fingerprint(path: &Path) -> (u32, u32, u32, u64, i64, i64, i64, i64) {
    let m = fs::symlink_metadata(path).expect("stat a jail directory");
    (
        m.mode(),
        m.uid(),
        m.gid(),
        m.nlink(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    )
}

fn names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .expect("list a jail directory")
        .map(|e| {
            e.expect("list a jail directory")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// Empties the jail.
fn clear_jail() {
    for name in names(Path::new("/")) {
        let path = Path::new("/").join(name);
        let removed = match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(&path),
            Ok(_) => fs::remove_file(&path),
            Err(e) => Err(e),
        };
        removed.expect("empty the jail");
    }
}

fn unpack_in_jail(layer: &[u8], compression: Compression) {
    clear_jail();
    let tmp = Path::new("/t");
    let root = tmp.join("root");
    fs::create_dir(tmp).expect("create /t");
    fs::create_dir(&root).expect("create /t/root");
    let before = (fingerprint(Path::new("/")), fingerprint(tmp));
    let result = unpack_layer(layer, compression, &root);
    let top = names(Path::new("/"));
    let beside = names(tmp);
    let after = (fingerprint(Path::new("/")), fingerprint(tmp));
    let root_is_dir = fs::symlink_metadata(&root).is_ok_and(|m| m.is_dir());
    clear_jail();
    let only = |set: &BTreeSet<String>, name: &str| set.len() == 1 && set.contains(name);
    assert!(
        only(&top, "t") && only(&beside, "root") && root_is_dir,
        "the layer wrote outside its root ({result:?}): / holds {top:?}, /t holds {beside:?}"
    );
    assert_eq!(
        before, after,
        "the layer changed a directory above its root ({result:?})"
    );
}

/// A registry's `hosts.toml`: the mirrors it lists, then the configured mirrors, then the
/// server, which always comes last.
pub fn hosts_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut cfg = RegistryConfig {
        insecure_registries: vec!["registry.fuzz:5000".into()],
        ca_file: Some("/etc/berth/ca.pem".into()),
        ..Default::default()
    };
    cfg.mirrors
        .insert("docker.io".into(), vec!["http://mirror.fuzz:5000".into()]);
    let host_dir = Path::new("/etc/berth/certs.d/docker.io");
    for registry in ["docker.io", "registry.fuzz:5000"] {
        let Ok(endpoints) = hosts::endpoints_from_text(registry, &cfg, host_dir, text) else {
            continue;
        };
        let mirrors = usize::from(registry == "docker.io");
        let server = endpoints.last().expect("no server endpoint");
        assert!(endpoints.len() > mirrors, "{endpoints:?}");
        assert!(server.ca_files.ends_with(&["/etc/berth/ca.pem".into()]));
        for e in &endpoints {
            assert!(e.ca_files.iter().all(|f| f.is_absolute()), "{e:?}");
        }
    }
}

/// A current-thread runtime for the async parsers.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime")
    })
}

/// Header blocks decoded here (under 200 KiB encoded) compress and decompress back to themselves.
fn spdy_headers_round_trip(headers: &spdy::Headers) {
    let encoded: usize = 4 + headers
        .iter()
        .map(|(k, v)| 8 + k.len() + v.len())
        .sum::<usize>();
    if encoded > 200 * 1024 {
        return;
    }
    let block = HeaderCompressor::new()
        .compress(headers)
        .expect("compress decoded headers");
    let again = HeaderDecompressor::new()
        .decompress(&block)
        .expect("decompress re-encoded headers");
    assert_eq!(&again, headers);
}

/// SPDY frames read off the bytes; SYN_STREAM and SYN_REPLY header blocks decoded with one
/// decompression context (a fresh one after an error), other control payloads with a fresh one.
pub fn spdy_frames(data: &[u8]) {
    runtime().block_on(async {
        let mut wire = data;
        let mut z = HeaderDecompressor::new();
        loop {
            match spdy::read_frame(&mut wire).await {
                Ok(Some(Frame::Control { kind, payload, .. })) => {
                    if kind == 1 || kind == 2 {
                        match spdy::parse_syn(&mut z, kind, &payload) {
                            Ok((id, headers)) => {
                                assert!(id <= 0x7fff_ffff);
                                assert!(headers.len() <= 1024);
                                spdy_headers_round_trip(&headers);
                            }
                            Err(_) => z = HeaderDecompressor::new(),
                        }
                    } else if let Ok(headers) = HeaderDecompressor::new().decompress(&payload) {
                        spdy_headers_round_trip(&headers);
                    }
                }
                Ok(Some(Frame::Data { stream, .. })) => assert!(stream <= 0x7fff_ffff),
                Ok(None) | Err(_) => break,
            }
        }
    });
}

/// The server side of a WebSocket connection fed the bytes by a client that then closes its
/// side (and reads what the server sends: pongs, a close); messages are read to the end.
pub fn websocket_frames(data: &[u8]) {
    runtime().block_on(async {
        let (client, server_io) = duplex(64 * 1024);
        let (mut from_server, mut to_server) = tokio::io::split(client);
        let send = async move {
            let _ = to_server.write_all(data).await;
            let _ = to_server.shutdown().await;
        };
        let drain = async move {
            let _ = tokio::io::copy(&mut from_server, &mut tokio::io::sink()).await;
        };
        let serve = async move {
            let (mut reader, _writer) = ws::server(server_io).await;
            while let Ok(Some(m)) = reader.next().await {
                assert!(m.data.len() <= ws::MAX_MESSAGE);
            }
        };
        tokio::join!(send, drain, serve);
    });
}

/// The channel protocols' decoding: the first byte picks the WebSocket opcode and base64; the
/// rest is one message's data, a query string, a `port` header and a stream of resize messages.
pub fn channel_protocols(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let base64 = pick & 1 != 0;
    let opcodes = [
        ws::OP_TEXT,
        ws::OP_BINARY,
        ws::OP_CLOSE,
        ws::OP_PING,
        ws::OP_PONG,
    ];
    let opcode = opcodes[usize::from(pick >> 1) % opcodes.len()];
    let message = || ws::Message {
        opcode,
        data: Bytes::copy_from_slice(rest),
    };
    for decoded in [
        remotecommand::decode_message(message(), base64),
        portforward::decode_message(message(), base64),
    ] {
        if let ChannelMessage::Data(channel, payload) = decoded {
            if base64 && opcode == ws::OP_TEXT {
                assert_eq!(channel, rest[0].wrapping_sub(b'0'));
                let encoded = ws::base64_encode(&payload);
                assert_eq!(
                    ws::base64_decode(encoded.as_bytes()).as_deref(),
                    Some(&payload[..])
                );
            } else {
                assert_eq!((channel, &payload[..]), (rest[0], &rest[1..]));
            }
        }
    }

    let text = String::from_utf8_lossy(rest);
    let request = k8s_cri::v1::PortForwardRequest {
        pod_sandbox_id: "fuzz".into(),
        port: vec![8080],
    };
    if let Ok(ports) = portforward::query_ports(&text, &request) {
        assert!(
            !ports.is_empty() && ports.iter().all(|p| *p > 0),
            "{ports:?}"
        );
        // Port i is served on channels 2i and 2i + 1, one byte each.
        assert!(
            ports.len() <= portforward::MAX_WS_PORTS,
            "{} ports",
            ports.len()
        );
    }
    if let Some(port) = portforward::spdy_port(Some(&text)) {
        assert!(port > 0);
    }

    // Resize messages arrive in data frames cut anywhere.
    let cut = usize::from(pick >> 4) + 1;
    let mut buf = Vec::new();
    for chunk in rest.chunks(cut) {
        buf.extend_from_slice(chunk);
        let _ = remotecommand::take_resizes(&mut buf);
        assert!(buf.len() <= 4096, "resize buffer grew to {}", buf.len());
    }
}

/// D-Bus messages decoded one after another off the bytes, as a connection reads them.
pub fn dbus_message(data: &[u8]) {
    let mut rest = data;
    while let Ok(Some((m, used))) = dbus::parse_message(rest) {
        assert!(
            (16..=rest.len()).contains(&used),
            "{used} of {}",
            rest.len()
        );
        assert!(m.fds.is_empty());
        rest = &rest[used..];
    }
}

/// CNI results (pod IPs), cached attachment records, network configs and the bandwidth
/// quantities of pod annotations.
pub fn cni_result(data: &[u8]) {
    let check = |ips: &[IpAddr]| {
        assert!(
            ips.windows(2).all(|w| !(w[0].is_ipv6() && w[1].is_ipv4())),
            "IPv4 not first: {ips:?}"
        );
        for (i, ip) in ips.iter().enumerate() {
            assert!(!ips[i + 1..].contains(ip), "{ip} twice: {ips:?}");
        }
    };
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        check(&pod_ips(&value, "eth0"));
        check(&pod_ips(&value, ""));
    }
    if let Ok(entry) = serde_json::from_slice::<CniCacheEntry>(data) {
        if let Some(result) = &entry.result {
            check(&pod_ips(result, &entry.ifname));
        }
        let _ = NetworkConfig::from_json(&entry.config, &entry.source);
    }
    let path = Path::new("/etc/cni/net.d/10-fuzz.conflist");
    for list in [true, false] {
        if let Ok(conf) = NetworkConfig::parse(data, list, path) {
            let again = NetworkConfig::from_json(&conf.to_json(), path)
                .expect("a parsed config's JSON parses again");
            assert_eq!(
                (&again.name, &again.cni_version, again.disable_check),
                (&conf.name, &conf.cni_version, conf.disable_check)
            );
            assert_eq!(again.plugins.len(), conf.plugins.len());
            let _ = conf.supports_check();
        }
    }
    let text = String::from_utf8_lossy(data);
    let _ = capabilities::quantity(&text);
    if let Ok(bits) = capabilities::bandwidth(&text) {
        assert!((1_000..=1_000_000_000_000_000).contains(&bits), "{bits}");
    }
}

/// Static pod manifests: a file that parses gives the same pods (UIDs, hashes) every time, each
/// with a namespace and the UID of its path, namespace and name.
pub fn pod_manifest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/etc/kubernetes/manifests/fuzz.yaml");
    let Ok(pods) = pod_manifests::parse(path, text) else {
        return;
    };
    let again = pod_manifests::parse(path, text).expect("the same text parses again");
    assert_eq!(pods.len(), again.len());
    for (p, q) in pods.iter().zip(&again) {
        assert_eq!((&p.uid, &p.hash), (&q.uid, &q.hash));
        let (namespace, name) = pod_manifests::key_of(&p.pod);
        assert!(!namespace.is_empty() && !name.is_empty());
        assert_eq!(p.uid, pod_manifests::stable_uid(path, &namespace, &name));
        assert_eq!(p.pod.metadata.uid.as_deref(), Some(p.uid.as_str()));
    }
}

/// The shim's framing (`split_frame`) and the request and response messages a frame carries:
/// a decoded message encodes and decodes back to itself.
pub fn shim_protocol(data: &[u8]) {
    use prost::Message as _;
    match shim_frame::split_frame(data) {
        Ok(Some(body)) => {
            let declared = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
            assert!(body.len() == declared && declared <= shim_frame::MAX_FRAME);
            if let Ok(request) = shim_api::Request::decode(body) {
                let again = shim_api::Request::decode(request.encode_to_vec().as_slice())
                    .expect("a re-encoded request decodes");
                assert_eq!(again, request);
            }
            if let Ok(response) = shim_api::Response::decode(body) {
                let again = shim_api::Response::decode(response.encode_to_vec().as_slice())
                    .expect("a re-encoded response decodes");
                assert_eq!(again, response);
            }
        }
        Ok(None) => {
            if let Some(head) = data.get(..4) {
                let declared = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
                assert!(data.len() - 4 < declared);
            }
        }
        Err(_) => {
            let declared = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
            assert!(declared > shim_frame::MAX_FRAME);
        }
    }
}
