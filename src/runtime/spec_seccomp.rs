//! Berth's built-in RuntimeDefault seccomp profile and loading of Localhost profiles.
//!
//! The profile is our own, written from the Linux syscall tables (x86_64, i386, x32, aarch64,
//! arm) with the intent documented for Docker's and containerd's defaults: deny by default with
//! EPERM, allow what ordinary programs use, and allow the syscalls that reach namespaces, mounts,
//! modules, BPF, tracing and setting the clock only when the container holds the capability
//! that the kernel would check anyway. Never allowed: the kernel keyring (keyctl, add_key,
//! request_key: it is not namespaced), kexec, pivot_root, userfaultfd, modify_ldt, io_uring,
//! and sockets of the AF_ALG and AF_VSOCK families. Notes:
//! - `clone` is allowed only with flags below `CLONE_NEWCGROUP` (0x0200_0000): that admits every
//!   fork/thread/vfork flag combination and refuses CLONE_NEWCGROUP/NEWUTS/NEWIPC/NEWUSER/NEWPID/
//!   NEWNET (and the rare CLONE_IO). An `SCMP_CMP_LT` comparison is used instead of a masked
//!   compare because runtimes disagree on which of `value`/`valueTwo` is the mask.
//! - `clone3` cannot be filtered on its flags (they are in memory), so it fails with ENOSYS and
//!   libc falls back to `clone`.
//! - io_uring is refused (its operations bypass this filter).
//! - Names unknown to the host's libseccomp are skipped by libcontainer with a warning.

use std::collections::HashSet;
use std::path::Path;

use oci_spec::runtime::{
    Arch, Capability, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder,
    LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};

use super::spec::SpecError;

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;
/// The lowest namespace flag of clone(2): CLONE_NEWCGROUP.
const CLONE_FIRST_NS_FLAG: u64 = 0x0200_0000;

/// Allowed for every container.
#[rustfmt::skip]
const ALLOWED: &[&str] = &[
    // file descriptors and I/O
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2",
    "pwritev2", "open", "openat", "openat2", "name_to_handle_at", "creat", "close", "close_range", "lseek", "_llseek",
    "dup", "dup2", "dup3", "pipe", "pipe2", "fcntl", "fcntl64", "ioctl", "flock", "fsync",
    "fdatasync", "sync", "syncfs", "sync_file_range", "sync_file_range2", "arm_sync_file_range",
    "truncate", "truncate64", "ftruncate", "ftruncate64", "fallocate", "fadvise64",
    "fadvise64_64", "arm_fadvise64_64", "readahead", "sendfile", "sendfile64", "splice", "tee",
    "vmsplice", "copy_file_range",
    // file metadata and directories
    "stat", "stat64", "lstat", "lstat64", "fstat", "fstat64", "newfstatat", "fstatat64", "statx",
    "statfs", "statfs64", "fstatfs", "fstatfs64", "access", "faccessat", "faccessat2", "readlink",
    "readlinkat", "getdents", "getdents64", "getcwd", "chdir", "fchdir", "mkdir", "mkdirat",
    "rmdir", "rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat", "unlink",
    "unlinkat", "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "chown32", "fchown",
    "fchown32", "fchownat", "lchown", "lchown32", "umask", "utime", "utimes", "utimensat",
    "utimensat_time64", "futimesat", "mknod", "mknodat", "getxattr", "lgetxattr", "fgetxattr",
    "setxattr", "lsetxattr", "fsetxattr", "listxattr", "llistxattr", "flistxattr", "removexattr",
    "lremovexattr", "fremovexattr", "getxattrat", "setxattrat", "listxattrat", "removexattrat",
    "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_mark",
    "statmount", "listmount",
    // memory
    "brk", "mmap", "mmap2", "munmap", "mremap", "mprotect", "pkey_mprotect", "pkey_alloc",
    "pkey_free", "madvise", "mlock", "mlock2", "munlock", "mlockall", "munlockall", "mincore",
    "msync", "remap_file_pages", "memfd_create", "memfd_secret", "membarrier", "map_shadow_stack",
    "mseal", "cachestat", "process_mrelease",
    // processes and credentials
    "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "waitpid",
    "getpid", "getppid", "gettid", "getpgid", "setpgid", "getpgrp", "getsid", "setsid", "getuid",
    "getuid32", "geteuid", "geteuid32", "getgid", "getgid32", "getegid", "getegid32", "getresuid",
    "getresuid32", "getresgid", "getresgid32", "getgroups", "getgroups32", "setuid", "setuid32",
    "setgid", "setgid32", "setreuid", "setreuid32", "setregid", "setregid32", "setresuid",
    "setresuid32", "setresgid", "setresgid32", "setfsuid", "setfsuid32", "setfsgid", "setfsgid32",
    "setgroups", "setgroups32", "capget", "capset", "prctl", "arch_prctl", "set_tid_address",
    "set_robust_list", "get_robust_list", "rseq", "getpriority", "setpriority", "sched_yield",
    "sched_getaffinity", "sched_setaffinity", "sched_getparam", "sched_setparam",
    "sched_getscheduler", "sched_setscheduler", "sched_get_priority_max",
    "sched_get_priority_min", "sched_rr_get_interval", "sched_rr_get_interval_time64",
    "sched_getattr", "sched_setattr", "getrlimit", "setrlimit", "prlimit64", "ugetrlimit",
    "getrusage", "times", "uname", "olduname", "oldolduname", "sysinfo", "getrandom", "getcpu",
    "ioprio_get", "ioprio_set", "kill", "tkill", "tgkill", "pidfd_open", "pidfd_send_signal",
    "set_thread_area", "get_thread_area", "restart_syscall", "seccomp", "landlock_create_ruleset",
    "landlock_add_rule", "landlock_restrict_self", "lsm_get_self_attr", "lsm_list_modules",
    "uretprobe",
    // signals
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigsuspend", "rt_sigpending",
    "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
    "sigaction", "sigprocmask", "sigreturn", "sigsuspend", "sigpending", "sigaltstack", "signal",
    "signalfd", "signalfd4", "pause", "alarm",
    // time (reading it; setting it needs CAP_SYS_TIME below)
    "time", "gettimeofday", "clock_gettime", "clock_gettime64", "clock_getres",
    "clock_getres_time64", "clock_nanosleep", "clock_nanosleep_time64", "nanosleep", "getitimer",
    "setitimer", "timer_create", "timer_delete", "timer_settime", "timer_settime64",
    "timer_gettime", "timer_gettime64", "timer_getoverrun", "timerfd_create", "timerfd_settime",
    "timerfd_settime64", "timerfd_gettime", "timerfd_gettime64", "adjtimex", "clock_adjtime",
    "clock_adjtime64",
    // waiting and events
    "select", "_newselect", "pselect6", "pselect6_time64", "poll", "ppoll", "ppoll_time64",
    "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_wait", "epoll_wait_old",
    "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2", "futex", "futex_time64", "futex_waitv",
    "futex_wait", "futex_wake", "futex_requeue", "io_setup", "io_destroy", "io_submit",
    "io_cancel", "io_getevents", "io_pgetevents", "io_pgetevents_time64",
    // sockets
    "socketpair", "bind", "listen", "accept", "accept4", "connect", "getsockname",
    "getpeername", "getsockopt", "setsockopt", "sendto", "recvfrom", "sendmsg", "recvmsg",
    "sendmmsg", "recvmmsg", "recvmmsg_time64", "shutdown", "socketcall", "send", "recv",
    // System V and POSIX IPC (namespaced)
    "ipc", "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop",
    "semtimedop_time64", "semctl", "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink",
    "mq_timedsend", "mq_timedsend_time64", "mq_timedreceive", "mq_timedreceive_time64",
    "mq_notify", "mq_getsetattr",
    // arm-only helpers
    "breakpoint", "cacheflush", "set_tls",
];

/// Allowed only when the container holds the capability.
#[rustfmt::skip]
const BY_CAPABILITY: &[(Capability, &[&str])] = &[
    (
        Capability::SysAdmin,
        &[
            "bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen", "fspick",
            "lookup_dcookie", "mount", "mount_setattr", "move_mount", "open_tree",
            "perf_event_open", "quotactl", "quotactl_fd", "setdomainname", "sethostname", "setns",
            "syslog", "umount", "umount2", "unshare", "lsm_set_self_attr",
        ],
    ),
    (Capability::SysBoot, &["reboot"]),
    (Capability::SysChroot, &["chroot"]),
    (
        Capability::SysModule,
        &["init_module", "finit_module", "delete_module"],
    ),
    (Capability::SysPacct, &["acct"]),
    (
        Capability::SysPtrace,
        &[
            "ptrace", "kcmp", "pidfd_getfd", "process_vm_readv", "process_vm_writev",
            "process_madvise",
        ],
    ),
    (Capability::SysRawio, &["iopl", "ioperm"]),
    (
        Capability::SysTime,
        &[
            "settimeofday", "stime", "clock_settime", "clock_settime64",
        ],
    ),
    (Capability::SysTtyConfig, &["vhangup"]),
    (
        Capability::SysNice,
        &["get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"],
    ),
    (Capability::Syslog, &["syslog"]),
    (Capability::Bpf, &["bpf"]),
    (Capability::Perfmon, &["perf_event_open"]),
    (Capability::DacReadSearch, &["open_by_handle_at"]),
];

/// Address families socket(2) refuses: AF_ALG (the kernel's crypto API) and AF_VSOCK.
const AF_ALG: u64 = 38;
const AF_VSOCK: u64 = 40;

/// personality(2) values allowed without capabilities: PER_LINUX, PER_LINUX32, UNAME26,
/// UNAME26|PER_LINUX32 and the query value 0xffffffff.
const PERSONALITIES: &[u64] = &[0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

fn architectures() -> Vec<Arch> {
    if cfg!(target_arch = "x86_64") {
        vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32]
    } else if cfg!(target_arch = "aarch64") {
        vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm]
    } else {
        vec![Arch::ScmpArchNative]
    }
}

fn rule(names: Vec<String>, action: LinuxSeccompAction) -> Result<LinuxSyscall, SpecError> {
    Ok(LinuxSyscallBuilder::default()
        .names(names)
        .action(action)
        .build()?)
}

fn owned(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_string()).collect()
}

/// Builds the RuntimeDefault profile for a container holding `caps` (its bounding set).
pub fn runtime_default(caps: &HashSet<Capability>) -> Result<LinuxSeccomp, SpecError> {
    let mut allowed: Vec<String> = owned(ALLOWED);
    for (cap, names) in BY_CAPABILITY {
        if caps.contains(cap) {
            for n in *names {
                if !allowed.iter().any(|a| a == n) {
                    allowed.push((*n).to_string());
                }
            }
        }
    }
    let mut syscalls = vec![rule(allowed, LinuxSeccompAction::ScmpActAllow)?];

    if !caps.contains(&Capability::SysAdmin) {
        syscalls.push(
            LinuxSyscallBuilder::default()
                .names(owned(&["clone"]))
                .action(LinuxSeccompAction::ScmpActAllow)
                .args(vec![
                    LinuxSeccompArgBuilder::default()
                        .index(0usize)
                        .value(CLONE_FIRST_NS_FLAG)
                        .op(LinuxSeccompOperator::ScmpCmpLt)
                        .build()?,
                ])
                .build()?,
        );
        syscalls.push(
            LinuxSyscallBuilder::default()
                .names(owned(&["clone3"]))
                .action(LinuxSeccompAction::ScmpActErrno)
                .errno_ret(ENOSYS)
                .build()?,
        );
    }

    // socket(2) for every family but AF_ALG and AF_VSOCK: three comparisons, one OR.
    let cmp = |value: u64, op: LinuxSeccompOperator| {
        LinuxSeccompArgBuilder::default()
            .index(0usize)
            .value(value)
            .op(op)
            .build()
    };
    syscalls.push(
        LinuxSyscallBuilder::default()
            .names(owned(&["socket"]))
            .action(LinuxSeccompAction::ScmpActAllow)
            .args(vec![
                cmp(AF_ALG, LinuxSeccompOperator::ScmpCmpLt)?,
                cmp(AF_ALG + 1, LinuxSeccompOperator::ScmpCmpEq)?,
                cmp(AF_VSOCK, LinuxSeccompOperator::ScmpCmpGt)?,
            ])
            .build()?,
    );

    let personality_args = PERSONALITIES
        .iter()
        .map(|&v| {
            LinuxSeccompArgBuilder::default()
                .index(0usize)
                .value(v)
                .op(LinuxSeccompOperator::ScmpCmpEq)
                .build()
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Several comparisons on one argument are added as separate rules (an OR).
    syscalls.push(
        LinuxSyscallBuilder::default()
            .names(owned(&["personality"]))
            .action(LinuxSeccompAction::ScmpActAllow)
            .args(personality_args)
            .build()?,
    );

    Ok(LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActErrno)
        .default_errno_ret(EPERM)
        .architectures(architectures())
        .syscalls(syscalls)
        .build()?)
}

/// Loads a Localhost profile: a JSON file in the OCI `linux.seccomp` format at an absolute path.
pub fn load_localhost(path: &str, field: &str) -> Result<LinuxSeccomp, SpecError> {
    let p = Path::new(path);
    if path.is_empty() || !p.is_absolute() {
        return Err(SpecError::invalid(
            field,
            format!("localhost seccomp profile path {path:?} must be absolute"),
        ));
    }
    let text = std::fs::read_to_string(p).map_err(|e| {
        SpecError::invalid(field, format!("cannot read seccomp profile {path}: {e}"))
    })?;
    serde_json::from_str(&text).map_err(|e| {
        SpecError::invalid(
            field,
            format!("seccomp profile {path} is not an OCI seccomp profile: {e}"),
        )
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn allowed_unconditionally(p: &LinuxSeccomp) -> HashSet<String> {
        p.syscalls()
            .iter()
            .flatten()
            .filter(|s| s.action() == LinuxSeccompAction::ScmpActAllow && s.args().is_none())
            .flat_map(|s| s.names().iter().cloned())
            .collect()
    }

    #[test]
    fn default_profile_denies_dangerous_syscalls_without_caps() {
        let p = runtime_default(&HashSet::new()).unwrap();
        assert_eq!(p.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(p.default_errno_ret(), Some(EPERM));
        let allowed = allowed_unconditionally(&p);
        for n in [
            "read",
            "write",
            "execve",
            "openat",
            "faccessat2",
            "futex",
            "clock_adjtime",
            "name_to_handle_at",
        ] {
            assert!(allowed.contains(n), "{n} should be allowed");
        }
        for n in [
            "unshare",
            "mount",
            "umount2",
            "reboot",
            "kexec_load",
            "kexec_file_load",
            "keyctl",
            "add_key",
            "request_key",
            "bpf",
            "setns",
            "ptrace",
            "init_module",
            "io_uring_setup",
            "clone",
            "clone3",
            "personality",
            "pivot_root",
            "open_by_handle_at",
            "socket",
            "userfaultfd",
        ] {
            assert!(!allowed.contains(n), "{n} should not be allowed");
        }
        let clone = p
            .syscalls()
            .iter()
            .flatten()
            .find(|s| s.names() == &vec!["clone".to_string()])
            .unwrap();
        let arg = clone.args().as_ref().unwrap()[0];
        assert_eq!(arg.op(), LinuxSeccompOperator::ScmpCmpLt);
        assert_eq!(arg.value(), CLONE_FIRST_NS_FLAG);
        let clone3 = p
            .syscalls()
            .iter()
            .flatten()
            .find(|s| s.names() == &vec!["clone3".to_string()])
            .unwrap();
        assert_eq!(clone3.errno_ret(), Some(ENOSYS));
        // No name is listed twice in the allow rule.
        let all = &p.syscalls().as_ref().unwrap()[0];
        let set: HashSet<_> = all.names().iter().collect();
        assert_eq!(set.len(), all.names().len());
    }

    #[test]
    fn capabilities_unlock_their_syscalls() {
        let caps: HashSet<_> = [
            Capability::SysAdmin,
            Capability::SysPtrace,
            Capability::SysBoot,
        ]
        .into_iter()
        .collect();
        let p = runtime_default(&caps).unwrap();
        let allowed = allowed_unconditionally(&p);
        for n in [
            "unshare", "mount", "clone", "clone3", "setns", "ptrace", "reboot",
        ] {
            assert!(allowed.contains(n), "{n} should be allowed");
        }
        // The keyring is not namespaced: no capability opens it.
        for n in [
            "keyctl",
            "add_key",
            "request_key",
            "pivot_root",
            "userfaultfd",
        ] {
            assert!(!allowed.contains(n), "{n} stays refused");
        }
        assert!(!allowed.contains("kexec_load"));
        assert!(!allowed.contains("init_module"));
    }

    #[test]
    fn default_profile_round_trips_as_json() {
        let p = runtime_default(&HashSet::new()).unwrap();
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(json["defaultErrnoRet"], 1);
        let back: LinuxSeccomp = serde_json::from_value(json).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn localhost_profile_loading() {
        let dir = crate::util::ScratchDir::new("seccomp");
        let good = dir.join("good.json");
        std::fs::write(
            &good,
            r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir"],"action":"SCMP_ACT_ERRNO"}]}"#,
        )
        .unwrap();
        let p = load_localhost(good.to_str().unwrap(), "seccomp.localhost_ref").unwrap();
        assert_eq!(p.default_action(), LinuxSeccompAction::ScmpActAllow);
        let missing = dir.join("missing.json");
        let e = load_localhost(missing.to_str().unwrap(), "seccomp.localhost_ref").unwrap_err();
        assert!(e.is_invalid_argument());
        assert!(e.to_string().contains("missing.json"));
        let bad = dir.join("bad.json");
        std::fs::write(&bad, "not json").unwrap();
        assert!(
            load_localhost(bad.to_str().unwrap(), "x")
                .unwrap_err()
                .is_invalid_argument()
        );
        assert!(
            load_localhost("rel.json", "x")
                .unwrap_err()
                .is_invalid_argument()
        );
    }
}
