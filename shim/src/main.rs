//! berth-shim: the per-container supervisor (creates one container, owns its stdio, serves the shim API).

mod args;
mod clone_into;
mod console;
mod container;
mod crilog;
mod daemon;
mod enter;
mod error;
mod exec_process;
mod exitfile;
mod frame;
mod mem;
mod oom_watch;
mod proto;
mod server;
mod stream;
mod timefmt;

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;

use args::Args;
use console::ConsoleSocket;
use container::{Ctr, Stdio};
use crilog::{LineSplitter, Stream};
use error::{IoContext, ShimError};

fn main() {
    // Inherited descriptors would leak into the container's processes and keep the caller's
    // pipes open: keep only stdin, stdout and stderr.
    // SAFETY: close_range takes integers only; nothing in this process owns fds >= 3 yet.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    let args = match Args::parse(std::env::args_os().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("berth-shim: {e}");
            std::process::exit(2);
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .init();
    // Container processes inherit the shim's signal dispositions: SIGPIPE must be the default
    // (Rust sets it to ignored). The shim itself sends on sockets with MSG_NOSIGNAL.
    // SAFETY: setting a standard disposition for one signal; no handler code is involved.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };

    let reporter = match daemon::detach() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("berth-shim: {e}");
            std::process::exit(1);
        }
    };
    match setup(args) {
        Ok(shim) => {
            if let Err(e) = daemon::detach_stdio() {
                reporter.failure(&e.to_string());
                std::process::exit(1);
            }
            reporter.success(std::process::id(), shim.init_pid());
            mem::trim();
            shim.run();
        }
        Err(e) => {
            reporter.failure(&e.to_string());
            std::process::exit(1);
        }
    }
}

/// Binds the socket, opens stdio and creates the container.
fn setup(args: Args) -> Result<server::Shim, ShimError> {
    if !args.bundle.join("config.json").is_file() {
        return Err(ShimError::Precondition(format!(
            "bundle {}: no config.json",
            args.bundle.display()
        )));
    }
    if let Some(dir) = args.socket.parent() {
        fs::create_dir_all(dir).ctx(|| format!("create {}", dir.display()))?;
    }
    fs::create_dir_all(&args.state_root)
        .ctx(|| format!("create state root {}", args.state_root.display()))?;
    let _ = fs::remove_file(&args.socket);
    let listener =
        UnixListener::bind(&args.socket).ctx(|| format!("bind {}", args.socket.display()))?;
    let socket = args.socket.clone();
    let cleanup = move |e: ShimError| {
        let _ = fs::remove_file(&socket);
        e
    };
    let log = crilog::LogFile::open(&args.log_path)
        .ctx(|| "open log".to_string())
        .map_err(&cleanup)?;
    let created = if args.tty {
        create_with_tty(&args)
    } else {
        create_with_pipes(&args)
    };
    let (mut ctr, outs, stdin_keep) = created.map_err(&cleanup)?;
    let pidfd = ctr
        .pid()
        .ok_or_else(|| ShimError::Precondition("created container has no pid".into()))
        .and_then(|pid| server::pidfd_open(pid).ctx(|| format!("pidfd_open {pid}")));
    match pidfd {
        Ok(pidfd) => Ok(server::Shim::new(
            args, ctr, listener, log, outs, stdin_keep, pidfd,
        )),
        Err(e) => {
            abandon(&mut ctr);
            Err(cleanup(e))
        }
    }
}

/// Output sources with their splitters, and the stdin end the shim keeps open.
type Created = (Ctr, [Option<(OwnedFd, LineSplitter)>; 2], Option<OwnedFd>);

/// Stdout and stderr through pipes; stdin a pipe (--stdin) or /dev/null.
fn create_with_pipes(args: &Args) -> Result<Created, ShimError> {
    let (out_r, out_w) = server::cloexec_pipe().ctx(|| "pipe".to_string())?;
    let (err_r, err_w) = server::cloexec_pipe().ctx(|| "pipe".to_string())?;
    let (stdin_child, stdin_keep) = if args.stdin {
        let (r, w) = server::cloexec_pipe().ctx(|| "pipe".to_string())?;
        (r, Some(w))
    } else {
        let null = fs::File::open("/dev/null").ctx(|| "open /dev/null".to_string())?;
        (null.into(), None)
    };
    let stdio = Stdio {
        stdin: Some(stdin_child),
        stdout: out_w,
        stderr: err_w,
    };
    let ctr = Ctr::create(args, Some(stdio), None)?;
    let outs = [
        Some((out_r, LineSplitter::new(Stream::Stdout))),
        Some((err_r, LineSplitter::new(Stream::Stderr))),
    ];
    Ok((ctr, outs, stdin_keep))
}

/// A pty: libcontainer sends its master over a console socket; all output is "stdout".
fn create_with_tty(args: &Args) -> Result<Created, ShimError> {
    let console = ConsoleSocket::bind(&args.state_root.join(format!(".console-{}.sock", args.id)))?;
    let mut ctr = Ctr::create(args, None, Some(console.path()))?;
    match console.receive_master() {
        Ok(master) => {
            let keep = master.try_clone().ctx(|| "dup pty master".to_string());
            match keep {
                Ok(keep) => Ok((
                    ctr,
                    [Some((master, LineSplitter::for_tty())), None],
                    Some(keep),
                )),
                Err(e) => {
                    abandon(&mut ctr);
                    Err(e)
                }
            }
        }
        Err(e) => {
            abandon(&mut ctr);
            Err(e)
        }
    }
}

/// Kills, reaps and deletes a container whose set-up failed after create.
fn abandon(ctr: &mut Ctr) {
    if let Some(pid) = ctr.pid() {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(pid, None);
    }
    let _ = ctr.delete();
}
