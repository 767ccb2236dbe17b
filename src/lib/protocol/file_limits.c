/* SPDX-License-Identifier: MIT */
/*
 * Direct-I/O limits of a file or block device.
 *
 * Order of trust: what the kernel states (statx STATX_DIOALIGN, BLKSSZGET and
 * the queue's dma_alignment for block devices, XFS_IOC_DIOINFO on xfs), then
 * O_DIRECT read probes at offset 0. A probe accepted at 1 byte says nothing:
 * unallocated blocks (holes) accept any size and any buffer on several
 * filesystems. When nothing answered, max(4096, page size) is used.
 */
#include "protocol/file.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

/* XFS_IOC_DIOINFO, defined here so that xfsprogs headers are not needed. */
struct bi_xfs_dioattr {
    uint32_t d_mem;
    uint32_t d_miniosz;
    uint32_t d_maxiosz;
};
#define BI_XFS_IOC_DIOINFO _IOR('X', 30, struct bi_xfs_dioattr)

static uint32_t fallback_align(const struct bi_file_limit_facts *f)
{
    return BI_MAX(BI_FILE_MAX_PROBE, f->page_size);
}

/* A probe answer is usable when it is a real size (> 1). */
static uint32_t probe_answer(uint32_t v)
{
    return v > 1 ? v : 0;
}

void bi_file_limits_compute(const struct bi_file_limit_facts *f,
                            struct bi_limits *out)
{
    uint32_t page = f->page_size ? f->page_size : 4096;

    memset(out, 0, sizeof(*out));
    out->max_transfer = f->max_transfer;
    out->max_iov = f->max_iov ? f->max_iov : 1024;

    if (!f->direct) {
        out->request_alignment = 1;
        out->request_alignment_source = BI_SRC_BUFFERED;
        out->min_mem_alignment = 1;
        out->mem_alignment_source = BI_SRC_BUFFERED;
        out->opt_mem_alignment = page;
        return;
    }

    /* NFS takes any alignment with O_DIRECT (what QEMU knows too); only a
     * statement from the kernel overrides that. */
    if (f->byte_aligned_fs && !f->statx_offset_align) {
        out->request_alignment = 1;
        out->request_alignment_source = BI_SRC_DRIVER;
        out->min_mem_alignment = 1;
        out->mem_alignment_source = BI_SRC_DRIVER;
        out->opt_mem_alignment = page;
        return;
    }

    /* Request (offset and length) alignment. */
    if (f->statx_offset_align) {
        out->request_alignment = f->statx_offset_align;
        out->request_alignment_source = BI_SRC_STATX;
    } else if (f->is_blockdev && f->blkssz) {
        out->request_alignment = f->blkssz;
        out->request_alignment_source = BI_SRC_BLKSSZGET;
    } else if (f->xfs_miniosz) {
        out->request_alignment = f->xfs_miniosz;
        out->request_alignment_source = BI_SRC_XFS_DIOINFO;
    } else if (f->probed && probe_answer(f->probe_request)) {
        out->request_alignment = f->probe_request;
        out->request_alignment_source = BI_SRC_PROBE;
    } else if (f->probed) {
        out->request_alignment = fallback_align(f);
        out->request_alignment_source = BI_SRC_FALLBACK;
    }

    /* Minimum memory alignment (below it the block layer bounces). */
    if (f->statx_mem_align) {
        out->min_mem_alignment = f->statx_mem_align;
        out->mem_alignment_source = BI_SRC_STATX;
    } else if (f->is_blockdev && (f->dma_align || f->blkssz)) {
        /* The queue's DMA alignment is what the kernel checks buffers
         * against; without it the logical sector size is always safe. */
        out->min_mem_alignment = f->dma_align ? f->dma_align : f->blkssz;
        out->mem_alignment_source = BI_SRC_BLKSSZGET;
    } else if (f->probed && probe_answer(f->probe_mem)) {
        out->min_mem_alignment = f->probe_mem;
        out->mem_alignment_source = BI_SRC_PROBE;
    } else if (f->probed) {
        out->min_mem_alignment = fallback_align(f);
        out->mem_alignment_source = BI_SRC_FALLBACK;
    }

    /* What we allocate with: never below the page size (seed 000). */
    out->opt_mem_alignment = BI_MAX(out->min_mem_alignment, page);

    /* max_transfer must be a multiple of the request alignment. */
    if (out->max_transfer && out->request_alignment > 1) {
        out->max_transfer =
            bi_align_down(out->max_transfer, out->request_alignment);
        if (!out->max_transfer) {
            out->max_transfer = out->request_alignment;
        }
    }
}

uint64_t bi_file_first_block_size(uint64_t size, uint32_t align)
{
    uint64_t max_bs = BI_MAX((uint64_t)BI_FILE_MAX_PROBE, (uint64_t)align);
    uint64_t v = BI_MIN(size, max_bs);
    uint64_t p = 1;

    if (!v) {
        return 0;
    }
    while (p * 2 <= v) {
        p *= 2;
    }
    if (align > 1 && p % align) {
        return 0;
    }
    return p;
}

const char *bi_file_fs_name(long f_type)
{
    static const struct {
        unsigned long magic;
        const char *name;
    } fs[] = {
        {0xEF53, "ext4"},      {0x58465342, "xfs"},     {0x01021994, "tmpfs"},
        {0x858458f6, "ramfs"}, {0x9123683E, "btrfs"},   {0x6969, "nfs"},
        {0x2FC12FC1, "zfs"},   {0xFF534D42, "cifs"},    {0xFE534D42, "smb2"},
        {0x65735546, "fuse"},  {0x794c7630, "overlay"}, {0xF2F52010, "f2fs"},
        {0x4d44, "vfat"},      {0x5346544e, "ntfs"},    {0x2011BAB0, "exfat"},
        {0x00c36400, "ceph"},  {0x47504653, "gpfs"},    {0x0BD00BD0, "lustre"},
        {0x01161970, "gfs2"},  {0x7461636f, "ocfs2"},   {0x62656572, "sysfs"},
        {0x9fa0, "proc"},      {0x1373, "devfs"},       {0x62646576, "bdev"},
    };
    for (size_t i = 0; i < BI_ARRAY_SIZE(fs); i++) {
        if ((unsigned long)(unsigned int)f_type == fs[i].magic) {
            return fs[i].name;
        }
    }
    return "unknown";
}

/* Reads a small unsigned number from a sysfs file; 0 if absent. */
static uint64_t read_sysfs_u64(const char *path)
{
    char buf[64];
    FILE *fp = fopen(path, "re");
    unsigned long long v = 0;

    if (!fp) {
        return 0;
    }
    if (fgets(buf, sizeof(buf), fp)) {
        v = strtoull(buf, NULL, 10);
    }
    fclose(fp);
    return v;
}

static void blockdev_queue_facts(int fd, const struct stat *st,
                                 struct bi_file_limit_facts *f)
{
    char path[128];
    unsigned maj = major(st->st_rdev), min = minor(st->st_rdev);
    uint64_t kb, dma;

    snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/queue/max_sectors_kb",
             maj, min);
    kb = read_sysfs_u64(path);
    if (!kb) {
        /* A partition has no queue of its own: use the parent's. */
        snprintf(path, sizeof(path),
                 "/sys/dev/block/%u:%u/../queue/max_sectors_kb", maj, min);
        kb = read_sysfs_u64(path);
    }
    if (kb) {
        f->max_transfer = kb * 1024;
    } else {
        unsigned short sectors = 0;
        if (ioctl(fd, BLKSECTGET, &sectors) == 0 && sectors) {
            f->max_transfer = (uint64_t)sectors * 512;
        }
    }

    snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/queue/dma_alignment",
             maj, min);
    if (access(path, R_OK) != 0) {
        snprintf(path, sizeof(path),
                 "/sys/dev/block/%u:%u/../queue/dma_alignment", maj, min);
    }
    if (access(path, R_OK) == 0) {
        dma = read_sysfs_u64(path);
        /* The file holds a mask (alignment - 1). */
        if (bi_is_pow2(dma + 1)) {
            f->dma_align = (uint32_t)(dma + 1);
        }
    }
}

/* true if an O_DIRECT read of len bytes into buf at offset 0 is accepted.
 * Only EINVAL means "misaligned"; other errors (a failing disk) do not
 * say anything about alignment and count as accepted, as in QEMU. */
static bool dio_read_ok(int fd, void *buf, size_t len)
{
    ssize_t r;

    do {
        r = pread(fd, buf, len, 0);
    } while (r < 0 && errno == EINTR);
    return r >= 0 || errno != EINVAL;
}

static void probe(int fd, struct bi_file_limit_facts *f, uint32_t known_request)
{
    static const uint32_t sizes[] = {1, 512, 1024, 2048, 4096};
    size_t max_align = BI_MAX((size_t)BI_FILE_MAX_PROBE, (size_t)f->page_size);
    size_t len;
    uint8_t *buf;

    f->probed = true;
    f->probe_request = 0;
    f->probe_mem = 0;
    buf = bi_alloc_aligned(max_align, 3 * max_align);
    if (!buf) {
        return;
    }
    for (size_t i = 0; i < BI_ARRAY_SIZE(sizes); i++) {
        if (dio_read_ok(fd, buf, sizes[i])) {
            f->probe_request = sizes[i];
            break;
        }
    }
    /* Buffer alignment: read a length every request alignment divides. */
    len = max_align;
    if (known_request > len) {
        len = bi_align_up(len, known_request);
        bi_free_aligned(buf);
        buf = bi_alloc_aligned(max_align, len + max_align);
        if (!buf) {
            return;
        }
    }
    for (size_t i = 0; i < BI_ARRAY_SIZE(sizes); i++) {
        if (dio_read_ok(fd, buf + sizes[i], len)) {
            f->probe_mem = sizes[i];
            break;
        }
    }
    bi_free_aligned(buf);
}

/* Test hook: BLKIMG_LIMITS_SKIP="statx,blkssz,xfs" ignores those sources so
 * that the later ones (down to probing) can be exercised on real storage. */
static bool skip_source(const char *name)
{
    const char *v = getenv("BLKIMG_LIMITS_SKIP");
    size_t len = strlen(name);

    while (v && *v) {
        if (!strncmp(v, name, len) && (v[len] == ',' || v[len] == '\0')) {
            return true;
        }
        v = strchr(v, ',');
        if (v) {
            v++;
        }
    }
    return false;
}

void bi_file_limits_detect(int fd, bool direct, const struct stat *st,
                           struct bi_limits *out,
                           struct bi_file_limit_facts *facts)
{
    struct bi_file_limit_facts local;
    struct bi_file_limit_facts *f = facts ? facts : &local;
    long iov_max = sysconf(_SC_IOV_MAX);

    memset(f, 0, sizeof(*f));
    f->direct = direct;
    f->is_blockdev = S_ISBLK(st->st_mode);
    f->page_size = (uint32_t)bi_page_size();
    f->max_iov = iov_max > 0 ? (uint32_t)BI_MIN(iov_max, (long)INT_MAX) : 1024;

    if (f->is_blockdev) {
        blockdev_queue_facts(fd, st, f);
    }
    if (!direct) {
        bi_file_limits_compute(f, out);
        return;
    }

#ifdef STATX_DIOALIGN
    if (!skip_source("statx")) {
        struct statx sx;
        memset(&sx, 0, sizeof(sx));
        if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
            (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align &&
            sx.stx_dio_mem_align) {
            f->statx_offset_align = sx.stx_dio_offset_align;
            f->statx_mem_align = sx.stx_dio_mem_align;
        }
    }
#endif
    if (f->is_blockdev && !skip_source("blkssz")) {
        int ss = 0;
        if (ioctl(fd, BLKSSZGET, &ss) == 0 && ss > 0) {
            f->blkssz = (uint32_t)ss;
        }
    } else if (!f->is_blockdev) {
        struct bi_xfs_dioattr da;
        struct statfs sf;
        if (fstatfs(fd, &sf) == 0) {
            if ((unsigned long)sf.f_type == 0x58465342 && !skip_source("xfs") &&
                ioctl(fd, BI_XFS_IOC_DIOINFO, &da) == 0 && da.d_miniosz &&
                bi_is_pow2(da.d_miniosz)) {
                f->xfs_miniosz = da.d_miniosz;
            }
            if ((unsigned long)sf.f_type == 0x6969 /* NFS_SUPER_MAGIC */) {
                f->byte_aligned_fs = true;
            }
        }
    }

    bi_file_limits_compute(f, out);
    if (out->request_alignment_source == BI_SRC_NONE ||
        out->mem_alignment_source == BI_SRC_NONE) {
        probe(fd, f, out->request_alignment);
        bi_file_limits_compute(f, out);
    }
}
