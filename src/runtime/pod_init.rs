//! `berth-pod-init`, pid 1 of a pod's shared PID namespace, contained like a container.
//!
//! Every container of a pod that shares its PID namespace sees this process as `/proc/1`, so
//! it must give them nothing of the host: before it starts reaping it moves into a mount
//! namespace of its own whose root is an empty read-only tmpfs (the host's tree is unmounted),
//! drops every capability (bounding, ambient, permitted, effective, inheritable), becomes
//! uid/gid 65535 where that id is mapped, sets no_new_privs, makes itself non-dumpable (so
//! `/proc/1/*` needs CAP_SYS_PTRACE) and loads a seccomp filter that allows only the few system
//! calls of its loop. `/proc/1/root` and `/proc/1/mountinfo` then show that tmpfs alone. The
//! starter learns on the init's stdout whether all of it held: `ready`, or why not.

use std::io::Write;

/// What the init prints on its stdout once it is contained.
pub const READY: &str = "ready";

/// The user and group the init runs as where the id is mapped (in a pod's own user namespace
/// it may not be): the id pause containers use.
const INIT_ID: u32 = 65535;

/// The body of `berth-pod-init`: contains itself, reports on stdout, then reaps whatever is
/// re-parented to it and exits on SIGTERM or SIGINT. Runs single-threaded, never returns.
pub fn run() -> ! {
    if let Err(e) = contain() {
        let mut out = std::io::stdout();
        let _ = writeln!(out, "containing the pod init: {e}");
        let _ = out.flush();
        // SAFETY: _exit ends this process at once; nothing of it needs unwinding.
        unsafe { libc::_exit(1) };
    }
    // SAFETY: sigset_t is a plain C bitmask; sigemptyset/sigaddset initialise it, and
    // sigprocmask/sigwait only read it. This process is single-threaded.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        loop {
            let mut sig: libc::c_int = 0;
            if libc::sigwait(&set, &mut sig) != 0 {
                continue;
            }
            match sig {
                libc::SIGCHLD => {
                    while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
                }
                libc::SIGTERM | libc::SIGINT => libc::_exit(0),
                _ => {}
            }
        }
    }
}

/// Every step of the containment, in order; the first failure is returned.
fn contain() -> Result<(), String> {
    empty_root()?;
    drop_bounding_set()?;
    take_identity();
    clear_capabilities()?;
    rustix::thread::set_no_new_privs(true).map_err(|e| format!("no_new_privs: {e}"))?;
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers and changes only this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(format!(
            "PR_SET_DUMPABLE: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: close_range takes plain integers; descriptors from 3 up belong to nothing this
    // process uses (its stdio are 0 to 2).
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    load_seccomp()?;
    let mut out = std::io::stdout();
    out.write_all(READY.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("reporting: {e}"))?;
    // stdout and stderr become stdin's /dev/null: the starter reads until the pipe closes.
    for fd in [1, 2] {
        // SAFETY: dup2 onto the process's own stdio numbers; 0 is open (/dev/null).
        unsafe { libc::dup2(0, fd) };
    }
    Ok(())
}

/// A mount namespace of its own with an empty, read-only tmpfs as its root, the host's tree
/// detached from it.
fn empty_root() -> Result<(), String> {
    use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
    // SAFETY: this process is single-threaded (a fresh exec that has started no thread), so
    // the whole process moves into the new mount namespace.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }
        .map_err(|e| format!("unshare mount namespace: {e}"))?;
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(|e| format!("making / private: {e}"))?;
    // /dev exists on every Linux host; in this private namespace it only serves as the place
    // where the new root is mounted before the pivot.
    rustix::mount::mount(
        "berth-pod-init",
        "/dev",
        "tmpfs",
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        c"size=4k,nr_inodes=2,mode=0555",
    )
    .map_err(|e| format!("mounting the empty root: {e}"))?;
    rustix::process::chdir("/dev").map_err(|e| format!("chdir to the empty root: {e}"))?;
    // The old root ends up stacked on the new one and is detached right away.
    rustix::process::pivot_root(".", ".").map_err(|e| format!("pivot_root: {e}"))?;
    rustix::mount::unmount(".", UnmountFlags::DETACH)
        .map_err(|e| format!("detaching the host's tree: {e}"))?;
    rustix::process::chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    Ok(())
}

/// Empties the capability bounding set (needs CAP_SETPCAP, so before the ids change).
fn drop_bounding_set() -> Result<(), String> {
    for cap in 0..64 {
        // SAFETY: prctl(PR_CAPBSET_DROP) takes plain integers and changes only this process.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
            let e = std::io::Error::last_os_error();
            // EINVAL: past the last capability this kernel knows.
            if e.raw_os_error() == Some(libc::EINVAL) {
                return Ok(());
            }
            return Err(format!(
                "dropping capability {cap} from the bounding set: {e}"
            ));
        }
    }
    Ok(())
}

/// No supplementary groups and uid/gid [`INIT_ID`]. In a pod's own user namespace the id may
/// be unmapped (or the group list locked): the init then keeps its id there, which holds no
/// capability once [`clear_capabilities`] has run.
fn take_identity() {
    // SAFETY: setgroups with an empty list, and setresgid/setresuid with plain ids; this
    // process is single-threaded, so the credentials of the whole process change.
    unsafe {
        libc::setgroups(0, std::ptr::null());
        if libc::setresgid(INIT_ID, INIT_ID, INIT_ID) == 0 {
            libc::setresuid(INIT_ID, INIT_ID, INIT_ID);
        }
    }
}

/// Clears the ambient, permitted, effective and inheritable capability sets.
fn clear_capabilities() -> Result<(), String> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    rustix::thread::clear_ambient_capability_set()
        .map_err(|e| format!("clearing ambient capabilities: {e}"))?;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::empty(),
            inheritable: CapabilitySet::empty(),
        },
    )
    .map_err(|e| format!("clearing capabilities: {e}"))
}

/// `AUDIT_ARCH_*` of the architecture this build runs on.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// The system calls the init's loop makes (and the few of its report), nothing else.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn allowed_syscalls() -> Vec<libc::c_long> {
    let mut calls = vec![
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigtimedwait,
        libc::SYS_rt_sigreturn,
        libc::SYS_restart_syscall,
        libc::SYS_wait4,
        libc::SYS_waitid,
        libc::SYS_exit,
        libc::SYS_exit_group,
        libc::SYS_write,
        libc::SYS_dup3,
        libc::SYS_close,
    ];
    #[cfg(target_arch = "x86_64")]
    calls.push(libc::SYS_dup2);
    calls
}

/// The seccomp program: the architecture checked, the allowed calls, every other call kills
/// the process (an init that cannot make a call it needs is better gone than spinning).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn seccomp_program() -> Vec<libc::sock_filter> {
    const LD_ABS_W: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    // offsetof(struct seccomp_data, nr) and (…, arch).
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    /// Syscall numbers of the x32 ABI carry this bit; they are refused.
    const X32_BIT: u32 = 0x4000_0000;
    let stmt = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u16, k: u32, jt: u8, jf: u8| libc::sock_filter { code, jt, jf, k };
    let calls = allowed_syscalls();
    let mut prog = vec![
        stmt(LD_ABS_W, ARCH),
        jump(JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(LD_ABS_W, NR),
        jump(JGE_K, X32_BIT, 0, 1),
        stmt(RET_K, libc::SECCOMP_RET_KILL_PROCESS),
    ];
    for call in calls {
        // Syscall numbers are small and non-negative.
        let nr = u32::try_from(call).unwrap_or(u32::MAX);
        prog.push(jump(JEQ_K, nr, 0, 1));
        prog.push(stmt(RET_K, libc::SECCOMP_RET_ALLOW));
    }
    prog.push(stmt(RET_K, libc::SECCOMP_RET_KILL_PROCESS));
    prog
}

/// Loads [`seccomp_program`] (no_new_privs is already set).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn load_seccomp() -> Result<(), String> {
    let mut prog = seccomp_program();
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| "seccomp program too long".to_string())?,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `prog`, a valid array of `len` BPF instructions that outlives
    // the call; the kernel copies it.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const libc::sock_fprog,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(format!(
            "loading the seccomp filter: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// On architectures without a known audit number the init runs without a filter; the rest of
/// its containment holds.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn load_seccomp() -> Result<(), String> {
    Ok(())
}

#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests {
    use super::*;

    #[test]
    fn the_filter_checks_the_architecture_then_allows_only_the_loop() {
        let prog = seccomp_program();
        assert_eq!(prog[0].k, 4, "loads the arch first");
        assert_eq!(prog[1].k, AUDIT_ARCH);
        let allowed: Vec<u32> = prog
            .windows(2)
            .filter(|w| w[1].k == libc::SECCOMP_RET_ALLOW)
            .map(|w| w[0].k)
            .collect();
        for call in [
            libc::SYS_wait4,
            libc::SYS_rt_sigtimedwait,
            libc::SYS_exit_group,
        ] {
            assert!(allowed.contains(&(call as u32)), "{call} allowed");
        }
        for call in [
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_ptrace,
            libc::SYS_mount,
        ] {
            assert!(!allowed.contains(&(call as u32)), "{call} refused");
        }
        assert_eq!(
            prog.last().map(|i| i.k),
            Some(libc::SECCOMP_RET_KILL_PROCESS),
            "everything else kills"
        );
    }
}
