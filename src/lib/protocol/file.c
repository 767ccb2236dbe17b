/* SPDX-License-Identifier: MIT */
/*
 * The "file" protocol driver: regular files and block devices through POSIX
 * calls and the I/O engine.
 *
 * Requests reach it already aligned to n->limits and split by the generic
 * layer; it only turns them into engine I/O, resubmits short transfers and
 * zero-fills reads past the end of the file.
 */
#include "protocol/file.h"
#include "io/aio.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/cdrom.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

struct file_state {
    int fd;
    int open_flags;
    bool is_blk;
    bool direct;
    bool dsync;  /* O_DSYNC: every write is durable when it completes */
    bool unsafe; /* cache=unsafe: flushes are no-ops */
    bool use_lock;
    bool force_share;
    int lock_fd; /* holds the lock bytes; no I/O engine ever sees it */
    struct bi_file_lock lock;
    int flush_error;    /* sticky: a failed fdatasync loses the page cache */
    bool no_zero_range; /* FALLOC_FL_ZERO_RANGE refused once */
    bool no_medium;     /* host_cdrom on a drive without a disc */
    bool no_punch;      /* FALLOC_FL_PUNCH_HOLE refused once */
};

static int set_errno_error(bi_error *err, int ret, const char *fmt,
                           const char *arg)
{
    bi_error_set(err, ret, fmt, arg);
    return ret;
}

/* ------------------------------------------------------------ helpers */

/* A descriptor of its own for the image locks. OFD locks belong to an
 * open file description, and io_uring keeps the descriptions it did I/O
 * on alive until its ring is torn down, some time after the process
 * died: a lock on fd would outlive a killed blkimg by tens of
 * milliseconds (another tool then sees the image in use). A second
 * description of the same file, opened through /proc, is never given to
 * an engine and goes with the process. Falls back to fd itself. */
static int open_lock_fd(int fd)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    int lfd;
    do {
        lfd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    } while (lfd < 0 && errno == EINTR);
    return lfd >= 0 ? lfd : fd;
}

static void close_lock_fd(struct file_state *s)
{
    if (s->lock_fd >= 0 && s->lock_fd != s->fd) {
        close(s->lock_fd);
    }
    s->lock_fd = -1;
}

static int64_t run_io(struct bi_io *io)
{
    return bi_io_run(io);
}

/* Runs fn(arg) on a worker thread (blocking syscalls). */
static int run_work(int (*fn)(void *), void *arg)
{
    struct bi_io io;

    memset(&io, 0, sizeof(io));
    io.op = BI_IO_WORK;
    io.fd = -1;
    io.work_fn = fn;
    io.work_arg = arg;
    return (int)run_io(&io);
}

static int do_fallocate(struct file_state *s, int mode, uint64_t off,
                        uint64_t len)
{
    struct bi_io io;
    int64_t r;

    memset(&io, 0, sizeof(io));
    io.op = BI_IO_FALLOCATE;
    io.fd = s->fd;
    io.mode = mode;
    io.offset = off;
    io.len = len;
    r = run_io(&io);
    return r < 0 ? (int)r : 0;
}

struct fd_op {
    int fd;
    unsigned long req; /* ioctl */
    uint64_t a, b;     /* ioctl range: offset, length */
};

static int range_ioctl_work(void *arg)
{
    struct fd_op *op = arg;
    uint64_t range[2] = {op->a, op->b};
    if (ioctl(op->fd, op->req, range) < 0) {
        return -errno;
    }
    return 0;
}

static int64_t fd_size(int fd, bool is_blk)
{
    struct stat st;

    if (is_blk) {
        uint64_t sz;
        if (ioctl(fd, BLKGETSIZE64, &sz) < 0) {
            off_t end;
            if (errno != ENOTTY) {
                return -errno;
            }
            /* A character device: whatever lseek says, else empty. */
            end = lseek(fd, 0, SEEK_END);
            return end < 0 ? 0 : (int64_t)end;
        }
        return (int64_t)sz;
    }
    if (fstat(fd, &st) < 0) {
        return -errno;
    }
    return st.st_size;
}

/* Writes len zero bytes at off with plain pwrite from an aligned buffer
 * (synchronous; for create and the unaligned edges of preallocation). */
static int pwrite_zeroes_sync(int fd, uint64_t off, uint64_t len, size_t align)
{
    size_t chunk = 1 << 20;
    void *buf;
    int ret = 0;

    if (!len) {
        return 0;
    }
    chunk = BI_MIN(chunk, bi_align_up(len, align));
    buf = bi_alloc_aligned(align, chunk);
    if (!buf) {
        return -ENOMEM;
    }
    memset(buf, 0, chunk);
    while (len) {
        size_t n = BI_MIN(len, (uint64_t)chunk);
        ssize_t r = pwrite(fd, buf, n, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            ret = -errno;
            break;
        }
        if (r == 0) {
            ret = -ENOSPC;
            break;
        }
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    bi_free_aligned(buf);
    return ret;
}

/* A second, buffered file description on the same file (for writes that
 * cannot be aligned for O_DIRECT). */
static int reopen_buffered(int fd)
{
    char path[64];

    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    return open(path, O_WRONLY | O_CLOEXEC);
}

/* --------------------------------------------------------------- open */

static int file_open(bi_node *n, const struct bi_open_opts *o, bi_error *err)
{
    struct file_state *s = n->opaque;
    struct stat st;
    int64_t size;
    int flags;
    int ret;

    s->fd = -1;
    s->lock_fd = -1;
    s->direct = o->cache == BI_CACHE_NONE || o->cache == BI_CACHE_DIRECTSYNC;
    s->dsync =
        o->cache == BI_CACHE_WRITETHROUGH || o->cache == BI_CACHE_DIRECTSYNC;
    s->unsafe = o->cache == BI_CACHE_UNSAFE;
    s->use_lock = !o->no_lock;
    s->force_share = o->force_share;
    s->lock.perm = 0;
    s->lock.shared = BI_PERM_ALL;

    flags = (o->read_write ? O_RDWR : O_RDONLY) | O_CLOEXEC;
    if (s->direct) {
        flags |= O_DIRECT;
    }
    if (s->dsync) {
        flags |= O_DSYNC;
    }

    do {
        s->fd = open(n->filename, flags);
    } while (s->fd < 0 && errno == EINTR);
    if (s->fd < 0) {
        ret = -errno;
        if (ret == -EINVAL && s->direct) {
            return bi_error_setc(err, -EINVAL,
                                 "Could not open '%s': filesystem does not "
                                 "support O_DIRECT: %s (try cache=writeback)",
                                 n->filename, strerror(EINVAL));
        }
        /* A read-only filesystem is a permission problem for callers (the
         * message keeps the real cause), as in QEMU. */
        return bi_error_setc(err, ret == -EROFS ? -EACCES : ret,
                             "Could not open '%s': %s", n->filename,
                             strerror(-ret));
    }
    s->open_flags = flags;

    if (fstat(s->fd, &st) < 0) {
        ret = -errno;
        bi_error_set(err, ret, "Could not stat '%s'", n->filename);
        goto fail;
    }
    if (n->drv != &bi_drv_file && !S_ISBLK(st.st_mode) &&
        !S_ISCHR(st.st_mode)) {
        /* host_device, host_cdrom: devices only, in QEMU's words */
        ret = -EINVAL;
        bi_error_set(err, 0,
                     "'%s' driver requires '%s' to be either a character "
                     "or block device",
                     n->drv->name, n->filename);
        goto fail;
    }
    /* named (driver=file), file takes regular files only, as QEMU's */
    if (!S_ISREG(st.st_mode) &&
        ((n->driver_named && n->drv == &bi_drv_file) ||
         (!S_ISBLK(st.st_mode) && !S_ISCHR(st.st_mode)))) {
        ret = -EINVAL;
        bi_error_set(err, 0, "'file' driver requires '%s' to be a regular file",
                     n->filename);
        goto fail;
    }
    /* Character devices (e.g. /dev/null) are served like block devices,
     * as QEMU's host_device does. */
    s->is_blk = S_ISBLK(st.st_mode) || S_ISCHR(st.st_mode);
    /* QEMU's host_cdrom: a device that does not say it holds a disc (any
     * device but a CD drive) opens, and its reads and writes fail */
    s->no_medium =
        n->drv == &bi_drv_host_cdrom &&
        ioctl(s->fd, CDROM_DRIVE_STATUS, CDSL_CURRENT) != CDS_DISC_OK;

    if (s->is_blk && o->read_write) {
        int ro = 0;
        if (ioctl(s->fd, BLKROGET, &ro) == 0 && ro) {
            ret = -EACCES;
            bi_error_set(err, EACCES, "The device is not writable");
            goto fail;
        }
    }

    size = fd_size(s->fd, s->is_blk);
    if (size < 0) {
        ret = (int)size;
        bi_error_set(err, ret, "Could not get the size of '%s'", n->filename);
        goto fail;
    }
    n->size = (uint64_t)size;
    n->read_only = !o->read_write;
    n->cache = o->cache;

    if (s->use_lock) {
        unsigned perm = BI_PERM_CONSISTENT_READ;
        if (o->read_write) {
            perm |= BI_PERM_WRITE;
        }
        s->lock_fd = open_lock_fd(s->fd);
        ret = bi_file_lock_set(s->lock_fd, &s->lock, perm, BI_PERM_ALL,
                               n->filename, err);
        if (ret < 0) {
            goto fail;
        }
    }
    return 0;

fail:
    close_lock_fd(s);
    close(s->fd);
    s->fd = -1;
    return ret;
}

static void file_close(bi_node *n)
{
    struct file_state *s = n->opaque;

    if (!s || s->fd < 0) {
        return;
    }
    if (s->use_lock && s->lock_fd >= 0) {
        bi_file_lock_release(s->lock_fd, &s->lock);
    }
    close_lock_fd(s);
    close(s->fd);
    s->fd = -1;
}

/* Image locking (bi_driver.set_perm): QEMU's lock bytes on the fd. */
static int file_set_perm(bi_node *n, unsigned perm, unsigned shared,
                         bi_error *err)
{
    struct file_state *s = n->opaque;

    if (!s->use_lock || s->lock_fd < 0) {
        return 0;
    }
    if (s->force_share) {
        shared = BI_PERM_ALL;
    }
    return bi_file_lock_set(s->lock_fd, &s->lock, perm, shared, n->filename,
                            err);
}

/* Nothing to add to qemu-img info, but the file answers (QEMU's
 * file-posix does): the image's dirty flag is shown. */
static int file_get_info(bi_node *n, struct bi_image_info *info, bi_error *err)
{
    (void)n;
    (void)info;
    (void)err;
    return 0;
}

static void file_refresh_limits(bi_node *n)
{
    struct file_state *s = n->opaque;
    struct stat st;

    if (fstat(s->fd, &st) < 0) {
        memset(&st, 0, sizeof(st));
        st.st_mode = S_IFREG;
    }
    bi_file_limits_detect(s->fd, s->direct, &st, &n->limits, NULL);
}

/* ---------------------------------------------------------------- I/O */

static int file_flush_fd(bi_node *n)
{
    struct file_state *s = n->opaque;
    struct bi_io io;
    int64_t r;

    if (s->unsafe) {
        return 0;
    }
    if (s->flush_error) {
        /* After a failed fdatasync the kernel may have dropped the dirty
         * pages: never report later flushes as successful. */
        return s->flush_error;
    }
    memset(&io, 0, sizeof(io));
    io.op = BI_IO_FSYNC;
    io.fd = s->fd;
    r = run_io(&io);
    if (r < 0) {
        s->flush_error = (int)r;
        return (int)r;
    }
    return 0;
}

/* Moves [off, off+len) between the file and iov, resubmitting the rest
 * after a short transfer. A read that stops short (end of file; a direct
 * read stops short only there, or off the alignment) leaves zeroes; a
 * write that moves nothing is out of space. Sets *moved. */
static int file_transfer(bi_node *n, bool write, uint64_t off, uint64_t len,
                         const struct iovec *iov, int iovcnt, uint64_t *moved)
{
    struct file_state *s = n->opaque;
    uint32_t align =
        n->limits.request_alignment ? n->limits.request_alignment : 1;
    if (s->no_medium) {
        return -ENOMEDIUM; /* as QEMU's host_cdrom */
    }
    const struct iovec *cur = iov;
    int curcnt = iovcnt;
    struct iovec *sub = NULL;
    uint64_t done = 0;
    int ret = 0;

    while (done < len) {
        struct bi_io io;
        int64_t r;

        memset(&io, 0, sizeof(io));
        io.op = write ? BI_IO_WRITE : BI_IO_READ;
        io.fd = s->fd;
        io.cached = !s->direct;
        io.iov = cur;
        io.iovcnt = curcnt;
        io.offset = off + done;
        r = run_io(&io);
        if (r == -EINTR || r == -EAGAIN) {
            continue;
        }
        if (r < 0) {
            ret = (int)r;
            break;
        }
        if (write && r == 0) {
            ret = -ENOSPC;
            break;
        }
        bi_stats_io(n, write ? 0 : (uint64_t)r, write ? (uint64_t)r : 0);
        done += (uint64_t)r;
        if (!write && (r == 0 || (done < len && s->direct &&
                                  !bi_is_aligned(off + done, align)))) {
            bi_iov_memset(iov, iovcnt, done, 0, len - done);
            break;
        }
        if (done < len) {
            if (!sub) {
                sub = bi_xmalloc(sizeof(*sub) * (size_t)iovcnt);
            }
            curcnt = bi_iov_slice(iov, iovcnt, done, len - done, sub, iovcnt);
            if (curcnt < 0) {
                ret = curcnt;
                break;
            }
            cur = sub;
        }
    }
    free(sub);
    *moved = done;
    return ret;
}

static int file_co_preadv(bi_node *n, uint64_t off, uint64_t len,
                          const struct iovec *iov, int iovcnt)
{
    uint64_t done;
    return file_transfer(n, false, off, len, iov, iovcnt, &done);
}

static int file_co_pwritev(bi_node *n, uint64_t off, uint64_t len,
                           const struct iovec *iov, int iovcnt, int flags)
{
    struct file_state *s = n->opaque;
    uint64_t done;
    int ret = file_transfer(n, true, off, len, iov, iovcnt, &done);

    if (!s->is_blk && off + done > n->size) {
        n->size = off + done;
    }
    if (ret == 0 && (flags & BI_REQ_FUA) && !s->dsync) {
        ret = file_flush_fd(n);
    }
    return ret;
}

static int file_co_flush(bi_node *n)
{
    return file_flush_fd(n);
}

/* ------------------------------------------------------ copy offload */

struct cfr_arg {
    int in_fd, out_fd;
    uint64_t in_off, out_off, len;
};

/* copy_file_range until len bytes moved (worker thread). */
static int cfr_work(void *opaque)
{
    struct cfr_arg *a = opaque;
    loff_t in = (loff_t)a->in_off, out = (loff_t)a->out_off;
    uint64_t left = a->len;

    while (left) {
        ssize_t r = copy_file_range(a->in_fd, &in, a->out_fd, &out, left, 0);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        if (r == 0) {
            return -EIO; /* source shorter than asked: copy it normally */
        }
        left -= (uint64_t)r;
    }
    return 0;
}

/* Copies [off, off+len) of n to dst_off of dst (another file node) with
 * copy_file_range on the nodes' own descriptors, so the destination's
 * locks, cache mode and flush state stay the driver's: a writethrough
 * destination is flushed after the copy, as its writes would be. Returns
 * 0 or -errno (the caller then copies through memory). */
static int file_co_copy_range(bi_node *n, uint64_t off, bi_node *dst,
                              uint64_t dst_off, uint64_t len)
{
    struct file_state *s = n->opaque, *d = dst->opaque;
    struct cfr_arg a = {.in_fd = s->fd,
                        .out_fd = d->fd,
                        .in_off = off,
                        .out_off = dst_off,
                        .len = len};
    int ret;

    if (dst->drv != n->drv || dst->read_only) {
        return -ENOTSUP;
    }
    ret = run_work(cfr_work, &a);
    if (ret < 0) {
        return ret;
    }
    bi_stats_io(dst, 0, len);
    if (!d->is_blk && dst_off + len > dst->size) {
        dst->size = dst_off + len;
    }
    return d->dsync ? file_flush_fd(dst) : 0;
}

/* ------------------------------------------------- zeroes and discard */

static bool is_unsupported(int ret)
{
    return ret == -EOPNOTSUPP || ret == -ENOTSUP || ret == -ENOSYS ||
           ret == -EINVAL || ret == -ENOTTY;
}

static int blk_range_ioctl(struct file_state *s, unsigned long req,
                           uint64_t off, uint64_t len)
{
    struct fd_op op = {.fd = s->fd, .req = req, .a = off, .b = len};
    int sector = 512;

    if (ioctl(s->fd, BLKSSZGET, &sector) < 0 || sector <= 0) {
        sector = 512;
    }
    if (!bi_is_aligned(off, (uint64_t)sector) ||
        !bi_is_aligned(len, (uint64_t)sector)) {
        return -ENOTSUP;
    }
    return run_work(range_ioctl_work, &op);
}

static int file_co_pwrite_zeroes(bi_node *n, uint64_t off, uint64_t len,
                                 int flags)
{
    struct file_state *s = n->opaque;
    uint64_t end = off + len;
    int64_t size;
    int ret;

    if (!len) {
        return 0;
    }
    if (s->is_blk) {
        if (flags & BI_REQ_NO_FALLBACK) {
            /* BLKZEROOUT may write zero buffers itself: not fast. */
            return -ENOTSUP;
        }
        ret = blk_range_ioctl(s, BLKZEROOUT, off, len);
        return is_unsupported(ret) ? -ENOTSUP : ret;
    }

    size = fd_size(s->fd, false);
    if (size < 0) {
        return (int)size;
    }

    if ((flags & BI_REQ_MAY_UNMAP) && !s->no_punch && off < (uint64_t)size) {
        ret = do_fallocate(s, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off,
                           BI_MIN(end, (uint64_t)size) - off);
        if (ret == 0) {
            if (end <= (uint64_t)size) {
                return 0;
            }
            /* The rest lies past the end of the file: extend it below with
             * an extend-only call. Never ftruncate here: a concurrent write
             * past `end` could land first and would be cut off. */
            off = (uint64_t)size;
            len = end - off;
        } else if (!is_unsupported(ret)) {
            return ret;
        } else {
            s->no_punch = true;
        }
    }

    if (!s->no_zero_range) {
        ret = do_fallocate(s, FALLOC_FL_ZERO_RANGE, off, len);
        if (ret == 0) {
            if (end > n->size) {
                n->size = end;
            }
            return 0;
        }
        if (!is_unsupported(ret)) {
            return ret;
        }
        s->no_zero_range = true;
    }

    /* Punch a hole, then allocate the range again (e.g. tmpfs). */
    if (!s->no_punch) {
        ret = 0;
        if (off < (uint64_t)size) {
            ret = do_fallocate(s, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                               off, BI_MIN(end, (uint64_t)size) - off);
        }
        if (ret == 0) {
            ret = do_fallocate(s, 0, off, len);
            if (ret == 0) {
                if (end > n->size) {
                    n->size = end;
                }
                return 0;
            }
        }
        if (!is_unsupported(ret)) {
            return ret;
        }
        s->no_punch = true;
    }
    return -ENOTSUP;
}

static int file_co_pdiscard(bi_node *n, uint64_t off, uint64_t len)
{
    struct file_state *s = n->opaque;
    int64_t size;
    int ret;

    if (!len) {
        return 0;
    }
    if (s->is_blk) {
        ret = blk_range_ioctl(s, BLKDISCARD, off, len);
        return is_unsupported(ret) ? -ENOTSUP : ret;
    }
    size = fd_size(s->fd, false);
    if (size < 0) {
        return (int)size;
    }
    if (off >= (uint64_t)size) {
        return 0;
    }
    len = BI_MIN(len, (uint64_t)size - off);
    ret = do_fallocate(s, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len);
    return is_unsupported(ret) ? -ENOTSUP : ret;
}

/* -------------------------------------------------------- block status */

static int file_co_block_status(bi_node *n, uint64_t off, uint64_t len,
                                struct bi_status *st)
{
    struct file_state *s = n->opaque;
    int64_t size = fd_size(s->fd, s->is_blk);

    if (size < 0) {
        return (int)size;
    }
    memset(st, 0, sizeof(*st));
    st->offset = off;
    st->file = n;
    st->depth = 0;

    if (off >= (uint64_t)size) {
        st->len = len;
        st->flags = BI_BS_ZERO | BI_BS_OFFSET_VALID | BI_BS_EOF;
        return 0;
    }
    len = BI_MIN(len, (uint64_t)size - off);

    if (s->is_blk) {
        st->len = len;
        st->flags = BI_BS_DATA;
    } else {
        off_t data = lseek(s->fd, (off_t)off, SEEK_DATA);
        if (data < 0) {
            if (errno == ENXIO) {
                /* A hole up to the end of the file. */
                st->len = len;
                st->flags = BI_BS_ZERO;
            } else {
                /* SEEK_DATA unsupported: everything is data. */
                st->len = len;
                st->flags = BI_BS_DATA;
            }
        } else if ((uint64_t)data > off) {
            st->len = BI_MIN(len, (uint64_t)data - off);
            st->flags = BI_BS_ZERO;
        } else {
            off_t hole = lseek(s->fd, (off_t)off, SEEK_HOLE);
            if (hole < 0 || (uint64_t)hole <= off) {
                st->len = len;
            } else {
                st->len = BI_MIN(len, (uint64_t)hole - off);
            }
            st->flags = BI_BS_DATA;
        }
    }
    st->flags |= BI_BS_OFFSET_VALID | BI_BS_ALLOCATED;
    if (off + st->len >= (uint64_t)size) {
        st->flags |= BI_BS_EOF;
    }
    return 0;
}

/* ----------------------------------------------------------- truncate */

/*
 * Allocates the first block of a file that grew from empty (seed 003): an
 * unallocated block 0 accepts O_DIRECT reads of any size on some
 * filesystems and defeats alignment probing. Writes zeroes at offset 0, a
 * power of two up to max(4096, align) and not past size, from an aligned
 * buffer so that it also works on an O_DIRECT descriptor. Failure is not an
 * error: this only helps later probes.
 */
static void allocate_first_block(int fd, uint64_t size, uint32_t align)
{
    uint64_t len = bi_file_first_block_size(size, align);
    size_t mem = BI_MAX(bi_page_size(), (size_t)BI_MAX(align, 1u));

    if (len) {
        (void)pwrite_zeroes_sync(fd, 0, len, mem);
    }
}

/* Writes real zeroes over [from, to) (preallocation=full). Works on an
 * O_DIRECT descriptor: the aligned middle is written directly, unaligned
 * edges through a buffered description of the same file. */
static int write_zeroes_full(int fd, bool direct, uint64_t from, uint64_t to,
                             uint32_t align, size_t mem_align)
{
    uint64_t a_from = from, a_to = to;
    int ret = 0;

    if (from >= to) {
        return 0;
    }
    if (direct && align > 1) {
        a_from = bi_align_up(from, align);
        a_to = bi_align_down(to, align);
        if (a_from >= a_to) {
            a_from = a_to = to; /* everything is an edge */
        }
    }
    if (a_from > from || a_to < to) {
        int bfd = reopen_buffered(fd);
        if (bfd < 0) {
            return -errno;
        }
        ret = pwrite_zeroes_sync(bfd, from, a_from - from, bi_page_size());
        if (ret == 0 && a_to < to) {
            ret = pwrite_zeroes_sync(bfd, BI_MAX(a_to, a_from),
                                     to - BI_MAX(a_to, a_from), bi_page_size());
        }
        if (ret == 0 && fdatasync(bfd) < 0) {
            ret = -errno;
        }
        close(bfd);
        if (ret < 0) {
            return ret;
        }
    }
    if (a_from < a_to) {
        ret = pwrite_zeroes_sync(fd, a_from, a_to - a_from, mem_align);
    }
    return ret;
}

struct truncate_job {
    int fd;
    bool direct;
    uint64_t size;
    enum bi_prealloc prealloc;
    uint32_t align;
    size_t mem_align;
    const char *what; /* failing step for the message */
};

/* Resizes a regular file with the given preallocation (runs on a worker
 * thread: every step is a blocking syscall). */
static int regular_truncate_work(void *arg)
{
    struct truncate_job *j = arg;
    struct stat st;
    uint64_t cur;
    int ret = 0;

    if (fstat(j->fd, &st) < 0) {
        j->what = "Could not stat file";
        return -errno;
    }
    cur = (uint64_t)st.st_size;

    switch (j->prealloc) {
    case BI_PREALLOC_OFF:
        if (ftruncate(j->fd, (off_t)j->size) < 0) {
            j->what = "Could not resize file";
            return -errno;
        }
        break;
    case BI_PREALLOC_FALLOC:
        if (j->size > cur) {
            ret = -posix_fallocate(j->fd, (off_t)cur, (off_t)(j->size - cur));
            if (ret < 0) {
                j->what = "Could not preallocate new data";
                return ret;
            }
        } else if (ftruncate(j->fd, (off_t)j->size) < 0) {
            j->what = "Could not resize file";
            return -errno;
        }
        break;
    case BI_PREALLOC_FULL:
        if (ftruncate(j->fd, (off_t)j->size) < 0) {
            j->what = "Could not resize file";
            return -errno;
        }
        if (j->size > cur) {
            ret = write_zeroes_full(j->fd, j->direct, cur, j->size, j->align,
                                    j->mem_align);
            if (ret < 0) {
                j->what = "Could not write zeros for preallocation";
                /* Do not leave a half-written tail behind. */
                if (ftruncate(j->fd, (off_t)cur) < 0) {
                    /* the write error is what matters */
                }
                return ret;
            }
            if (fdatasync(j->fd) < 0) {
                j->what = "Could not flush preallocated data";
                return -errno;
            }
        }
        break;
    default:
        j->what = "Unsupported preallocation mode";
        return -ENOTSUP;
    }
    if (cur == 0 && j->size > 0 && j->prealloc != BI_PREALLOC_FULL) {
        allocate_first_block(j->fd, j->size, j->align);
    }
    return 0;
}

static int file_co_truncate(bi_node *n, uint64_t size, bool exact,
                            enum bi_prealloc prealloc, bi_error *err)
{
    struct file_state *s = n->opaque;
    struct truncate_job j;
    int ret;

    if (s->is_blk) {
        int64_t cur = fd_size(s->fd, true);
        if (cur < 0) {
            bi_error_set(err, (int)cur, "Could not get the device size");
            return (int)cur;
        }
        if (prealloc != BI_PREALLOC_OFF) {
            bi_error_set(err, 0,
                         "Preallocation mode '%s' unsupported for this "
                         "non-regular file",
                         bi_prealloc_name(prealloc));
            return -ENOTSUP;
        }
        if (exact && size != (uint64_t)cur) {
            bi_error_set(err, 0, "Cannot resize device files");
            return -ENOTSUP;
        }
        if (size > (uint64_t)cur) {
            bi_error_set(err, 0, "Cannot grow device files");
            return -EINVAL;
        }
        return 0;
    }
    if (prealloc != BI_PREALLOC_OFF && prealloc != BI_PREALLOC_FALLOC &&
        prealloc != BI_PREALLOC_FULL) {
        bi_error_set(err, 0, "Unsupported preallocation mode: %s",
                     bi_prealloc_name(prealloc));
        return -ENOTSUP;
    }

    memset(&j, 0, sizeof(j));
    j.fd = s->fd;
    j.direct = s->direct;
    j.size = size;
    j.prealloc = prealloc;
    j.align = n->limits.request_alignment ? n->limits.request_alignment : 1;
    j.mem_align = BI_MAX((size_t)n->limits.opt_mem_alignment, bi_page_size());
    ret = run_work(regular_truncate_work, &j);
    if (ret < 0) {
        bi_error_set(err, ret, "%s", j.what ? j.what : "Could not resize file");
        return ret;
    }
    n->size = size;
    return 0;
}

/* ------------------------------------------------------------- create */

static int file_create(const char *filename, const struct bi_create_opts *o,
                       bi_error *err)
{
    struct bi_file_lock lk = {.perm = 0, .shared = BI_PERM_ALL};
    struct truncate_job j;
    struct stat st;
    /* QEMU's file protocol creates whole 512-byte sectors. */
    uint64_t size = bi_align_up(o->size, 512);
    int fd, ret;

    do {
        fd = open(filename, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        return set_errno_error(err, -errno, "Could not create '%s'", filename);
    }
    if (fstat(fd, &st) < 0) {
        ret = -errno;
        bi_error_set(err, ret, "Could not stat '%s'", filename);
        goto out;
    }

    if (S_ISBLK(st.st_mode)) {
        uint64_t devsize = 0;
        ret = bi_file_lock_set(
            fd, &lk, BI_PERM_CONSISTENT_READ | BI_PERM_WRITE | BI_PERM_RESIZE,
            BI_PERM_ALL, filename, err);
        if (ret < 0) {
            goto out;
        }
        if (o->prealloc != BI_PREALLOC_OFF) {
            bi_error_set(err, 0, "Unsupported preallocation mode '%s'",
                         bi_prealloc_name(o->prealloc));
            ret = -ENOTSUP;
            goto out;
        }
        if (ioctl(fd, BLKGETSIZE64, &devsize) < 0) {
            ret = -errno;
            bi_error_set(err, ret, "Could not get the size of '%s'", filename);
            goto out;
        }
        if (size > devsize) {
            bi_error_set(err, 0, "Cannot grow device files");
            ret = -EINVAL;
            goto out;
        }
        /* Erase whatever header the device held (through the page cache:
         * any sector size). */
        ret = pwrite_zeroes_sync(fd, 0, BI_MIN((uint64_t)512, devsize),
                                 bi_page_size());
        if (ret < 0) {
            bi_error_set(err, ret, "Could not write to '%s'", filename);
            goto out;
        }
        if (fdatasync(fd) < 0) {
            ret = -errno;
            bi_error_set(err, ret, "Could not flush '%s'", filename);
            goto out;
        }
        ret = 0;
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        ret = -EINVAL;
        bi_error_set(err, 0, "'file' driver requires '%s' to be a regular file",
                     filename);
        goto out;
    }
    if (o->prealloc != BI_PREALLOC_OFF && o->prealloc != BI_PREALLOC_FALLOC &&
        o->prealloc != BI_PREALLOC_FULL) {
        bi_error_set(err, 0, "Unsupported preallocation mode: %s",
                     bi_prealloc_name(o->prealloc));
        ret = -ENOTSUP;
        goto out;
    }

    /* Take the lock before touching the contents: an image in use by
     * another process must survive a mistaken create. */
    ret = bi_file_lock_set(fd, &lk, BI_PERM_WRITE | BI_PERM_RESIZE,
                           BI_PERM_ALL & ~BI_PERM_RESIZE, filename, err);
    if (ret < 0) {
        goto out;
    }

    if (ftruncate(fd, 0) < 0) {
        ret = -errno;
        bi_error_set(err, ret, "Could not clear '%s'", filename);
        goto out;
    }

    memset(&j, 0, sizeof(j));
    j.fd = fd;
    j.direct = false;
    j.size = size;
    j.prealloc = o->prealloc;
    j.align = 1;
    j.mem_align = bi_page_size();
    ret = regular_truncate_work(&j);
    if (ret < 0) {
        bi_error_set(err, ret, "%s", j.what ? j.what : "Could not resize file");
        goto out;
    }
    /* The first block went through the page cache; the image is usually
     * opened with O_DIRECT next. Leave no dirty page behind that writeback
     * could race with a direct write of the same block (stale cache). */
    if (fdatasync(fd) < 0) {
        ret = -errno;
        bi_error_set(err, ret, "Could not flush '%s'", filename);
        goto out;
    }
    ret = 0;

out:
    bi_file_lock_release(fd, &lk);
    if (close(fd) < 0 && ret == 0) {
        ret = -errno;
        bi_error_set(err, ret, "Could not close '%s'", filename);
    }
    return ret;
}

/* ---------------------------------------------------------------- info */

static int64_t file_get_allocated_file_size(bi_node *n)
{
    struct file_state *s = n->opaque;
    struct stat st;

    if (fstat(s->fd, &st) < 0) {
        return -errno;
    }
    return (int64_t)st.st_blocks * 512;
}

static void sysfs_sector_sizes(unsigned maj, unsigned min, uint32_t *logical,
                               uint32_t *physical)
{
    static const char *const names[2] = {"logical_block_size",
                                         "physical_block_size"};
    uint32_t *outs[2] = {logical, physical};

    for (int i = 0; i < 2; i++) {
        char path[160];
        char buf[32];
        FILE *fp;

        snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/queue/%s", maj, min,
                 names[i]);
        fp = fopen(path, "re");
        if (!fp) {
            /* A partition: its queue is the parent's. */
            snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/../queue/%s",
                     maj, min, names[i]);
            fp = fopen(path, "re");
        }
        if (!fp) {
            continue;
        }
        if (fgets(buf, sizeof(buf), fp)) {
            *outs[i] = (uint32_t)strtoul(buf, NULL, 10);
        }
        fclose(fp);
    }
}

static int file_storage_info(bi_node *n, struct bi_storage_info *out)
{
    struct file_state *s = n->opaque;
    struct statfs sf;
    struct stat st;

    memset(out, 0, sizeof(*out));
    out->page_size = (uint32_t)bi_page_size();
    if (fstat(s->fd, &st) < 0) {
        return -errno;
    }
    if (S_ISCHR(st.st_mode)) {
        out->filesystem = "character device";
        return 0;
    }
    if (s->is_blk) {
        int lss = 0;
        unsigned int pss = 0;
        out->is_block_device = true;
        out->filesystem = "block device";
        if (ioctl(s->fd, BLKSSZGET, &lss) == 0 && lss > 0) {
            out->logical_sector_size = (uint32_t)lss;
        }
        if (ioctl(s->fd, BLKPBSZGET, &pss) == 0 && pss > 0) {
            out->physical_sector_size = pss;
        }
        return 0;
    }
    if (fstatfs(s->fd, &sf) == 0) {
        out->filesystem = bi_file_fs_name((long)sf.f_type);
    } else {
        out->filesystem = "unknown";
    }
    if (major(st.st_dev) != 0) {
        sysfs_sector_sizes(major(st.st_dev), minor(st.st_dev),
                           &out->logical_sector_size,
                           &out->physical_sector_size);
    }
    return 0;
}

/* qemu 7.2's file protocol creation options, in its order. */
static const struct bi_opt_desc file_create_opts[] = {
    {"size", BI_OPT_SIZE, "Virtual disk size", NULL, 0},
    {"nocow", BI_OPT_BOOL, "Turn off copy-on-write (valid only on btrfs)", NULL,
     0},
    {"preallocation", BI_OPT_STRING,
     "Preallocation mode (allowed values: off, falloc, full)", NULL, 0},
    {"extent_size_hint", BI_OPT_SIZE,
     "Extent size hint for the image file, 0 to disable", NULL, 0},
    {NULL, 0, NULL, NULL, 0},
};

/* nocow and extent_size_hint (QEMU's default: 1 MiB) on the new file;
 * only a bad value fails (the hints themselves are best effort). */
static int file_create_prepare(const char *filename, const char *const *opts,
                               bi_error *err)
{
    struct bi_file_create_hints hints = {.extent_size_hint = 1 << 20};
    for (const char *const *p = opts; p && *p; p++) {
        size_t kl = strcspn(*p, "=");
        const char *v = (*p)[kl] ? *p + kl + 1 : NULL;
        if (kl == 5 && !strncmp(*p, "nocow", kl)) {
            hints.nocow = v && (!strcmp(v, "on") || !strcmp(v, "true"));
        } else if (kl == 16 && !strncmp(*p, "extent_size_hint", kl)) {
            if (!v || bi_parse_size(v, &hints.extent_size_hint) < 0) {
                bi_error_set(err, 0,
                             "Parameter 'extent_size_hint' expects a size");
                return -EINVAL;
            }
        }
    }
    bi_file_apply_create_hints(filename, &hints);
    return 0;
}

/* The table entries file shares with host_device and host_cdrom. */
#define FILE_OPS                                                               \
    .is_protocol = true, .state_size = sizeof(struct file_state),              \
    .open = file_open, .close = file_close,                                    \
    .refresh_limits = file_refresh_limits, .co_preadv = file_co_preadv,        \
    .co_pwritev = file_co_pwritev, .co_pwrite_zeroes = file_co_pwrite_zeroes,  \
    .co_pdiscard = file_co_pdiscard, .co_flush = file_co_flush,                \
    .co_truncate = file_co_truncate, .co_block_status = file_co_block_status,  \
    .get_allocated_file_size = file_get_allocated_file_size,                   \
    .storage_info = file_storage_info, .set_perm = file_set_perm,              \
    .get_info = file_get_info, .co_copy_range = file_co_copy_range

const struct bi_driver bi_drv_file = {
    .name = "file",
    .create = file_create,
    .create_opts = file_create_opts,
    .create_prepare = file_create_prepare,
    FILE_OPS,
};

/* QEMU's host_device and host_cdrom: the file driver on a block or
 * character device (anything else is refused at open). Named only by
 * options (driver=host_device, file.driver=host_device, -f host_device);
 * no image creation. */
const struct bi_driver bi_drv_host_device = {
    .name = "host_device",
    FILE_OPS,
};

const struct bi_driver bi_drv_host_cdrom = {
    .name = "host_cdrom",
    FILE_OPS,
};
