/* Tries the syscalls a container's seccomp profile must refuse and prints, one per line,
 * "<name>=<errno>" (0 when the call succeeded). Built static by the tests and bound into a
 * container, as busybox has no keyctl, ptrace or module loader. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KEYCTL_JOIN_SESSION_KEYRING 1

static int result(long rc) { return rc < 0 ? errno : 0; }

int main(void) {
    printf("unshare_user=%d\n", result(unshare(CLONE_NEWUSER)));
    printf("keyctl=%d\n", result(syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, "probe")));

    pid_t child = fork();
    if (child == 0) {
        pause();
        _exit(0);
    }
    printf("ptrace=%d\n", result(ptrace(PTRACE_ATTACH, child, 0, 0)));
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);

    printf("mount=%d\n", result(mount("none", "/tmp", "tmpfs", 0, NULL)));
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    printf("finit_module=%d\n", result(syscall(SYS_finit_module, fd, "", 0)));
    printf("init_module=%d\n", result(syscall(SYS_init_module, NULL, 0, "")));
    printf("socket_alg=%d\n", result(socket(AF_ALG, SOCK_SEQPACKET, 0)));
    printf("socket_inet=%d\n", result(socket(AF_INET, SOCK_STREAM, 0)));
    struct timex tx = {0};
    printf("clock_adjtime_read=%d\n", result(syscall(SYS_clock_adjtime, CLOCK_REALTIME, &tx)));
    return 0;
}
