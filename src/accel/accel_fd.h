/*
 * Passing a file descriptor between processes of one host without a
 * socket: the owner names its descriptor number in an exported handle, the
 * opener copies it with pidfd_open + pidfd_getfd (Linux 5.6).  Shared by the
 * vendors whose handles are descriptors (testgpu's memfd, CUDA's VMM POSIX
 * fd); header-only because each vendor module compiles its own copy.
 *
 * pidfd_getfd needs ptrace access to the owner: same uid, and under Yama's
 * ptrace_scope 1 the owner's leave (ferry_accel_fd_allow_peers).
 */
#ifndef FERRY_ACCEL_FD_H
#define FERRY_ACCEL_FD_H

#include <ferry/plugin.h>
#include <ferry/status.h>

#include <errno.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* glibc before 2.36 has no wrappers; these numbers are the same on every
 * architecture (the unified syscall table). */
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif
#ifndef PR_SET_PTRACER_ANY
#define PR_SET_PTRACER_ANY ((unsigned long)-1)
#endif

/* Let same-uid peers take our descriptors under Yama's ptrace_scope 1 (best
 * effort: without Yama there is nothing to allow). */
static inline void ferry_accel_fd_allow_peers(void)
{
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

/* A copy of descriptor remote_fd of process owner_pid, in *fd_p.
 * FERRY_ERR_STALE: the owner or its descriptor is gone;
 * FERRY_ERR_REMOTE_REFUSED: not allowed (another uid, Yama). */
static inline ferry_status_t ferry_accel_fd_take(const char *vendor, long owner_pid, int remote_fd,
                                                 int *fd_p)
{
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)owner_pid, 0);
    if (pidfd < 0) {
        if (errno == ESRCH)
            return FERRY_ERR_STALE;
        ferry_error("%s: pidfd_open(%ld): %s", vendor, owner_pid, strerror(errno));
        return FERRY_ERR_IO;
    }
    int fd = (int)syscall(SYS_pidfd_getfd, pidfd, remote_fd, 0);
    int getfd_errno = errno;
    close(pidfd);
    if (fd >= 0) {
        *fd_p = fd;
        return FERRY_OK;
    }
    if (getfd_errno == EBADF || getfd_errno == ESRCH)
        return FERRY_ERR_STALE;
    ferry_error("%s: pidfd_getfd(pid %ld, fd %d): %s", vendor, owner_pid, remote_fd,
                strerror(getfd_errno));
    return getfd_errno == EPERM ? FERRY_ERR_REMOTE_REFUSED : FERRY_ERR_IO;
}

#endif
