/* SPDX-License-Identifier: MIT */
/*
 * Creation-time hints for a new image file, set while it is still empty:
 * no copy-on-write (btrfs: nocow=on) and an extent size hint (xfs; QEMU
 * sets 1 MiB unless told otherwise, which keeps sparse images from
 * fragmenting).
 */
#include "protocol/file.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

int bi_file_apply_create_hints(const char *filename,
                               const struct bi_file_create_hints *h)
{
    struct stat st;
    if (stat(filename, &st) == 0 && !S_ISREG(st.st_mode))
        return 0; /* devices keep what they have */
    int fd = open(filename, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno; /* the driver's create reports it properly */
    if (h->nocow) {
        int attr = 0;
        if (ioctl(fd, FS_IOC_GETFLAGS, &attr) == 0) {
            attr |= FS_NOCOW_FL;
            (void)ioctl(fd, FS_IOC_SETFLAGS, &attr); /* btrfs only */
        }
    }
    if (h->extent_size_hint && h->extent_size_hint <= UINT32_MAX) {
        struct fsxattr fa;
        if (ioctl(fd, FS_IOC_FSGETXATTR, &fa) == 0 && fstat(fd, &st) == 0 &&
            st.st_size == 0) {
            fa.fsx_xflags |= FS_XFLAG_EXTSIZE;
            fa.fsx_extsize = (uint32_t)h->extent_size_hint;
            if (ioctl(fd, FS_IOC_FSSETXATTR, &fa) < 0 && errno != ENOTTY &&
                errno != EOPNOTSUPP && errno != EINVAL)
                bi_message(BI_MESSAGE_WARNING,
                           "warning: Failed to set the extent size hint of "
                           "'%s': %s",
                           filename, strerror(errno));
        }
    }
    close(fd);
    return 0;
}
