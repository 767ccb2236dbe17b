/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the file driver's pure logic: direct-I/O limits from what
 * each source said (statx, BLKSSZGET, XFS_IOC_DIOINFO, probes, holes), the
 * size of the first-block write, and the QEMU-compatible lock bytes (two
 * open file descriptions in one process conflict like two processes).
 * TAP output.
 */
#include "protocol/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int n_test;
static int n_fail;

static void ok(int cond, const char *fmt, ...)
{
    va_list ap;

    n_test++;
    if (!cond) {
        n_fail++;
        printf("not ok %d - ", n_test);
    } else {
        printf("ok %d - ", n_test);
    }
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

static struct bi_file_limit_facts facts(bool direct, uint32_t page)
{
    struct bi_file_limit_facts f;

    memset(&f, 0, sizeof(f));
    f.direct = direct;
    f.page_size = page;
    f.max_iov = 1024;
    return f;
}

static void expect(const char *name, const struct bi_limits *l, uint32_t req,
                   enum bi_limit_source req_src, uint32_t min_mem,
                   uint32_t opt_mem, enum bi_limit_source mem_src)
{
    ok(l->request_alignment == req, "%s: request_alignment %u == %u", name,
       l->request_alignment, req);
    ok(l->request_alignment_source == req_src,
       "%s: request_alignment_source %d == %d", name,
       (int)l->request_alignment_source, (int)req_src);
    ok(l->min_mem_alignment == min_mem, "%s: min_mem_alignment %u == %u", name,
       l->min_mem_alignment, min_mem);
    ok(l->opt_mem_alignment == opt_mem, "%s: opt_mem_alignment %u == %u", name,
       l->opt_mem_alignment, opt_mem);
    ok(l->mem_alignment_source == mem_src, "%s: mem_alignment_source %d == %d",
       name, (int)l->mem_alignment_source, (int)mem_src);
}

static void test_buffered(void)
{
    struct bi_file_limit_facts f = facts(false, 4096);
    struct bi_limits l;

    /* Whatever the kernel says about O_DIRECT does not apply. */
    f.statx_offset_align = 4096;
    f.statx_mem_align = 512;
    bi_file_limits_compute(&f, &l);
    expect("buffered", &l, 1, BI_SRC_BUFFERED, 1, 4096, BI_SRC_BUFFERED);
    ok(l.max_iov == 1024, "buffered: max_iov kept");

    f = facts(false, 65536);
    bi_file_limits_compute(&f, &l);
    ok(l.opt_mem_alignment == 65536, "buffered: opt_mem = page size 64K");
}

static void test_statx(void)
{
    struct bi_file_limit_facts f = facts(true, 4096);
    struct bi_limits l;

    /* ext4/xfs on a 4K-sector device: 4096 offsets, 512 buffers. */
    f.statx_offset_align = 4096;
    f.statx_mem_align = 512;
    bi_file_limits_compute(&f, &l);
    expect("statx 4K", &l, 4096, BI_SRC_STATX, 512, 4096, BI_SRC_STATX);

    /* statx wins over every other source, probes included. */
    f = facts(true, 4096);
    f.statx_offset_align = 512;
    f.statx_mem_align = 512;
    f.is_blockdev = true;
    f.blkssz = 4096;
    f.dma_align = 4;
    f.xfs_miniosz = 4096;
    f.probed = true;
    f.probe_request = 1;
    f.probe_mem = 1;
    bi_file_limits_compute(&f, &l);
    expect("statx first", &l, 512, BI_SRC_STATX, 512, 4096, BI_SRC_STATX);

    /* A memory alignment above the page size is also the optimum. */
    f = facts(true, 4096);
    f.statx_offset_align = 8192;
    f.statx_mem_align = 8192;
    bi_file_limits_compute(&f, &l);
    expect("statx 8K mem", &l, 8192, BI_SRC_STATX, 8192, 8192, BI_SRC_STATX);

    /* Never below the page size for what we allocate (seed 000). */
    f = facts(true, 16384);
    f.statx_offset_align = 512;
    f.statx_mem_align = 4;
    bi_file_limits_compute(&f, &l);
    expect("statx 16K page", &l, 512, BI_SRC_STATX, 4, 16384, BI_SRC_STATX);
}

static void test_blkssz(void)
{
    struct bi_file_limit_facts f = facts(true, 4096);
    struct bi_limits l;

    f.is_blockdev = true;
    f.blkssz = 4096;
    f.dma_align = 512;
    f.max_transfer = 1280 * 1024;
    bi_file_limits_compute(&f, &l);
    expect("blkssz+dma", &l, 4096, BI_SRC_BLKSSZGET, 512, 4096,
           BI_SRC_BLKSSZGET);
    ok(l.max_transfer == 1280 * 1024, "blkssz: max_transfer 1280K kept");

    /* Without the queue's dma_alignment the sector size is the safe
     * minimum. */
    f.dma_align = 0;
    bi_file_limits_compute(&f, &l);
    expect("blkssz only", &l, 4096, BI_SRC_BLKSSZGET, 4096, 4096,
           BI_SRC_BLKSSZGET);

    /* 512-byte disk. */
    f = facts(true, 4096);
    f.is_blockdev = true;
    f.blkssz = 512;
    f.dma_align = 512;
    bi_file_limits_compute(&f, &l);
    expect("blkssz 512", &l, 512, BI_SRC_BLKSSZGET, 512, 4096,
           BI_SRC_BLKSSZGET);

    /* BLKSSZGET means nothing for a regular file. */
    f = facts(true, 4096);
    f.blkssz = 512;
    bi_file_limits_compute(&f, &l);
    ok(l.request_alignment_source == BI_SRC_NONE,
       "blkssz on a regular file ignored: probe needed");

    /* max_transfer is kept a multiple of the request alignment. */
    f = facts(true, 4096);
    f.is_blockdev = true;
    f.blkssz = 4096;
    f.max_transfer = 4096 * 3 + 512;
    bi_file_limits_compute(&f, &l);
    ok(l.max_transfer == 4096 * 3, "max_transfer aligned down (%llu)",
       (unsigned long long)l.max_transfer);
    f.max_transfer = 512;
    bi_file_limits_compute(&f, &l);
    ok(l.max_transfer == 4096, "max_transfer never below the alignment");
}

static void test_xfs(void)
{
    struct bi_file_limit_facts f = facts(true, 4096);
    struct bi_limits l;

    f.xfs_miniosz = 4096;
    bi_file_limits_compute(&f, &l);
    ok(l.request_alignment == 4096 &&
           l.request_alignment_source == BI_SRC_XFS_DIOINFO,
       "xfs dioinfo: request alignment 4096 from XFS_IOC_DIOINFO");
    ok(l.mem_alignment_source == BI_SRC_NONE,
       "xfs dioinfo: memory alignment still unknown before probing");

    /* After the buffer probe. */
    f.probed = true;
    f.probe_request = 1; /* hole at block 0: ignored, xfs said 4096 */
    f.probe_mem = 512;
    bi_file_limits_compute(&f, &l);
    expect("xfs+probe", &l, 4096, BI_SRC_XFS_DIOINFO, 512, 4096, BI_SRC_PROBE);
}

static void test_probe(void)
{
    struct bi_file_limit_facts f = facts(true, 4096);
    struct bi_limits l;

    /* Nothing said, not probed yet: the caller must probe. */
    bi_file_limits_compute(&f, &l);
    ok(l.request_alignment_source == BI_SRC_NONE &&
           l.mem_alignment_source == BI_SRC_NONE,
       "no source, not probed: NONE (probe needed)");

    /* An allocated block 0 on a 512-byte disk. */
    f.probed = true;
    f.probe_request = 512;
    f.probe_mem = 512;
    bi_file_limits_compute(&f, &l);
    expect("probe 512", &l, 512, BI_SRC_PROBE, 512, 4096, BI_SRC_PROBE);

    f.probe_request = 4096;
    f.probe_mem = 512;
    bi_file_limits_compute(&f, &l);
    expect("probe 4096", &l, 4096, BI_SRC_PROBE, 512, 4096, BI_SRC_PROBE);
}

static void test_hole(void)
{
    struct bi_file_limit_facts f = facts(true, 4096);
    struct bi_limits l;

    /* Block 0 is a hole: every probe succeeds, even 1 byte (seed 003).
     * That is no answer: fall back, never to 1. */
    f.probed = true;
    f.probe_request = 1;
    f.probe_mem = 1;
    bi_file_limits_compute(&f, &l);
    expect("hole", &l, 4096, BI_SRC_FALLBACK, 4096, 4096, BI_SRC_FALLBACK);

    /* The fallback follows a larger page size. */
    f.page_size = 65536;
    bi_file_limits_compute(&f, &l);
    expect("hole 64K page", &l, 65536, BI_SRC_FALLBACK, 65536, 65536,
           BI_SRC_FALLBACK);

    /* Nothing accepted at all: fallback too. */
    f = facts(true, 4096);
    f.probed = true;
    f.probe_request = 0;
    f.probe_mem = 0;
    bi_file_limits_compute(&f, &l);
    expect("nothing accepted", &l, 4096, BI_SRC_FALLBACK, 4096, 4096,
           BI_SRC_FALLBACK);

    /* A hole, but statx knows: exact values, no fallback. */
    f = facts(true, 4096);
    f.probed = true;
    f.probe_request = 1;
    f.probe_mem = 1;
    f.statx_offset_align = 512;
    f.statx_mem_align = 512;
    bi_file_limits_compute(&f, &l);
    expect("hole+statx", &l, 512, BI_SRC_STATX, 512, 4096, BI_SRC_STATX);
}

static void test_nfs(void)
{
    struct bi_file_limit_facts f = facts(true, 4096);
    struct bi_limits l;

    /* NFS: O_DIRECT at any offset from any buffer; no probing (a probe
     * would accept 1 byte and fall back to 4096 for nothing). */
    f.byte_aligned_fs = true;
    bi_file_limits_compute(&f, &l);
    expect("nfs", &l, 1, BI_SRC_DRIVER, 1, 4096, BI_SRC_DRIVER);

    /* A kernel statement still wins. */
    f.statx_offset_align = 4096;
    f.statx_mem_align = 4;
    bi_file_limits_compute(&f, &l);
    expect("nfs+statx", &l, 4096, BI_SRC_STATX, 4, 4096, BI_SRC_STATX);
}

static void test_first_block(void)
{
    struct {
        uint64_t size;
        uint32_t align;
        uint64_t want;
    } c[] = {
        {1ull << 30, 1, 4096},
        {1ull << 30, 512, 4096},
        {1ull << 30, 4096, 4096},
        {1ull << 30, 65536, 65536},
        {100000, 1, 4096},
        {3000, 1, 2048},
        {3000, 512, 2048},
        {3000, 4096, 0},
        {4096, 4096, 4096},
        {1, 1, 1},
        {0, 1, 0},
        {1000, 1, 512},
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        uint64_t got = bi_file_first_block_size(c[i].size, c[i].align);
        ok(got == c[i].want,
           "first block size(%llu, align %u) = %llu (want %llu)",
           (unsigned long long)c[i].size, c[i].align, (unsigned long long)got,
           (unsigned long long)c[i].want);
    }
}

static void test_fs_name(void)
{
    ok(strcmp(bi_file_fs_name(0xEF53), "ext4") == 0, "fs name ext4");
    ok(strcmp(bi_file_fs_name(0x58465342), "xfs") == 0, "fs name xfs");
    ok(strcmp(bi_file_fs_name(0x01021994), "tmpfs") == 0, "fs name tmpfs");
    ok(strcmp(bi_file_fs_name((long)(int)0x9123683E), "btrfs") == 0,
       "fs name btrfs (sign-extended f_type)");
    ok(strcmp(bi_file_fs_name(0x12345), "unknown") == 0, "fs name unknown");
}

static void test_locks(void)
{
    char path[] = "/tmp/bi_test_lock_XXXXXX";
    struct bi_file_lock a = {.perm = 0, .shared = BI_PERM_ALL};
    struct bi_file_lock b = {.perm = 0, .shared = BI_PERM_ALL};
    bi_error err;
    int fd0 = mkstemp(path);
    int fa, fb, ret;

    ok(fd0 >= 0, "lock: temp file");
    if (fd0 < 0) {
        return;
    }
    fa = open(path, O_RDWR);
    fb = open(path, O_RDONLY);

    /* A qcow2 read-write user: holds CR|WRITE|RESIZE, shares no write. */
    ret = bi_file_lock_set(
        fa, &a, BI_PERM_CONSISTENT_READ | BI_PERM_WRITE | BI_PERM_RESIZE,
        BI_PERM_ALL & ~(BI_PERM_WRITE | BI_PERM_RESIZE), "img", NULL);
    ok(ret == 0, "lock: first writer locks");

    /* A read-only qcow2 user refuses to share write: conflict. */
    bi_error_init(&err);
    ret = bi_file_lock_set(fb, &b, BI_PERM_CONSISTENT_READ,
                           BI_PERM_ALL & ~(BI_PERM_WRITE | BI_PERM_RESIZE),
                           "img", &err);
    ok(ret == -EAGAIN, "lock: reader refusing write conflicts (%d)", ret);
    ok(strcmp(err.msg, "Failed to get shared \"write\" lock\n"
                       "Is another process using the image [img]?") == 0,
       "lock: QEMU's two-line message");
    ok(b.locked_perm == 0 && b.locked_unshared == 0,
       "lock: failed attempt leaves no bytes");

    /* force-share: takes only consistent read, conflicts with nothing. */
    ret = bi_file_lock_set(fb, &b, BI_PERM_CONSISTENT_READ, BI_PERM_ALL, "img",
                           NULL);
    ok(ret == 0, "lock: shared reader coexists");
    bi_file_lock_release(fb, &b);

    /* A second writer: "Failed to get "write" lock". */
    bi_error_init(&err);
    ret = bi_file_lock_set(fb, &b, BI_PERM_CONSISTENT_READ | BI_PERM_WRITE,
                           BI_PERM_ALL, "img", &err);
    ok(ret == -EAGAIN &&
           strcmp(err.msg, "Failed to get \"write\" lock\n"
                           "Is another process using the image [img]?") == 0,
       "lock: second writer refused with QEMU's message");

    /* Dropping the writer's restriction (as a raw user) lets it in. */
    ret = bi_file_lock_set(fa, &a, BI_PERM_CONSISTENT_READ | BI_PERM_WRITE,
                           BI_PERM_ALL, "img", NULL);
    ok(ret == 0 && a.locked_unshared == 0 &&
           a.locked_perm == (BI_PERM_CONSISTENT_READ | BI_PERM_WRITE),
       "lock: downgrade drops bytes (perm %x unshared %x)", a.locked_perm,
       a.locked_unshared);
    ret = bi_file_lock_set(fb, &b, BI_PERM_CONSISTENT_READ | BI_PERM_WRITE,
                           BI_PERM_ALL, "img", NULL);
    ok(ret == 0, "lock: two sharing writers coexist (QEMU raw semantics)");

    bi_file_lock_release(fa, &a);
    bi_file_lock_release(fb, &b);
    close(fa);
    close(fb);
    close(fd0);
    unlink(path);
}

int main(void)
{
    test_buffered();
    test_statx();
    test_blkssz();
    test_xfs();
    test_probe();
    test_hole();
    test_nfs();
    test_first_block();
    test_fs_name();
    test_locks();
    printf("1..%d\n", n_test);
    return n_fail ? 1 : 0;
}
