//! `image import` and `image export`: image archives through berthd's archive service.

use std::io::{Read, Write};

use anyhow::{Context, bail};
use berth::archive_api as api;
use berth::client::CriClient;
use bytes::Bytes;
use clap::Subcommand;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::{print_json, status_message};

/// Size of the chunks an archive is sent in.
const CHUNK: usize = 1024 * 1024;

#[derive(Subcommand)]
pub enum ImageAction {
    /// Import the images of an archive: an OCI image layout or a `docker save` archive, as a
    /// tar, gzip- or zstd-compressed or not. `-` reads stdin.
    Import {
        /// The archive, or `-` for stdin.
        file: String,
    },
    /// Export images into one archive that is both an OCI image layout and a `docker save`
    /// archive; name it with `-o FILE` (`-o -` writes to stdout).
    Export {
        /// Image references or ids.
        #[arg(required = true)]
        images: Vec<String>,
    },
}

/// Sends the archive `file` (or stdin) and prints what was imported.
pub async fn import(client: &CriClient, file: &str, json: bool) -> anyhow::Result<()> {
    let mut source: Box<dyn Read + Send> = if file == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(file).with_context(|| format!("opening {file}"))?)
    };
    let name = if file == "-" { "stdin" } else { file }.to_string();
    let (tx, rx) = mpsc::channel::<Result<api::ImportRequest, std::io::Error>>(4);
    let reader_name = name.clone();
    let reading = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut first = true;
        loop {
            let mut buf = vec![0u8; CHUNK];
            let n = read_full(&mut source, &mut buf)?;
            buf.truncate(n);
            let message = api::ImportRequest {
                name: if first {
                    reader_name.clone()
                } else {
                    String::new()
                },
                data: Bytes::from(buf),
            };
            first = false;
            if tx.blocking_send(Ok(message)).is_err() || n < CHUNK {
                return Ok(());
            }
        }
    });
    let stream =
        tokio_stream::wrappers::ReceiverStream::new(rx).filter_map(|m| async move { m.ok() });
    let answer = client.archives().import(stream).await;
    reading.await?.with_context(|| format!("reading {name}"))?;
    let images = answer.map_err(status_message)?.into_inner().images;
    if json {
        let list: Vec<_> = images
            .iter()
            .map(|i| {
                serde_json::json!({
                    "id": i.id, "repoTags": i.repo_tags, "repoDigests": i.repo_digests, "size": i.size,
                })
            })
            .collect();
        return print_json(&list);
    }
    for image in images {
        let names = if image.repo_tags.is_empty() {
            "<none>".to_string()
        } else {
            image.repo_tags.join(", ")
        };
        println!("Imported {} {names}", image.id);
    }
    Ok(())
}

/// Reads until `buf` is full or the input ends.
fn read_full(source: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match source.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Writes the archive of `images` to `output` (`-`: stdout). A file is written beside its
/// final name and renamed once complete, so a failed export leaves nothing.
pub async fn export(
    client: &CriClient,
    images: Vec<String>,
    output: Option<&str>,
) -> anyhow::Result<()> {
    let Some(output) = output else {
        bail!("image export: name the archive with -o FILE (or -o - for stdout)");
    };
    let mut stream = client
        .archives()
        .export(api::ExportRequest { images })
        .await
        .map_err(status_message)?
        .into_inner();
    if output == "-" {
        let mut out = std::io::stdout().lock();
        while let Some(chunk) = stream.next().await {
            out.write_all(&chunk.map_err(status_message)?.data)?;
        }
        return Ok(out.flush()?);
    }
    let path = std::path::Path::new(output);
    let partial = path.with_file_name(format!(
        ".{}.partial",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let result = async {
        let mut file = std::io::BufWriter::new(
            std::fs::File::create(&partial)
                .with_context(|| format!("creating {}", partial.display()))?,
        );
        while let Some(chunk) = stream.next().await {
            file.write_all(&chunk.map_err(status_message)?.data)
                .with_context(|| format!("writing {}", partial.display()))?;
        }
        let file = file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&partial, path).with_context(|| format!("renaming to {output}"))?;
        anyhow::Ok(())
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}
