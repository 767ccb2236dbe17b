/* SPDX-License-Identifier: MIT */
/*
 * blkimg compare: qemu-img compare compatible. Walks both images by block
 * status; ranges that are zero in both are not read, ranges allocated in
 * only one must read as zeroes, the rest is read and compared. Exit 0
 * identical, 1 different, 2 open error, 3 block status error, 4 read
 * error.
 */
#include "blkimg/blkimg.h"
#include "blkimg/convert.h"
#include "img.h"
#include "util/util.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cv_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cv_err_exit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cv_getopt_error(char **argv, int c);
bi_node *cv_open(const char *filename, const char *fmt, bool image_opts,
                 enum bi_cache cache, bool rw, bool force_share,
                 bool quiet_probe);

#define IO_BUF (2ULL * 1024 * 1024)
#define SECTOR 512ULL
#define STRICT_MASK                                                            \
    (BI_BS_DATA | BI_BS_ZERO | BI_BS_ALLOCATED | BI_BS_OFFSET_VALID |          \
     BI_BS_COMPRESSED | BI_BS_EOF)

static bool quiet;

static void qprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void qprintf(const char *fmt, ...)
{
    va_list ap;
    if (quiet) {
        return;
    }
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}

/* Offset of the first non-zero sector in buf, or -1. */
static int64_t find_nonzero(const uint8_t *buf, uint64_t n)
{
    for (uint64_t i = 0; i < n; i += SECTOR) {
        if (!bi_buf_is_zero(buf + i, BI_MIN(SECTOR, n - i))) {
            return (int64_t)i;
        }
    }
    return -1;
}

/* Bytes from the start that compare equal, in whole sectors, up to the
 * first sector that differs; sets *differ if the first sector differs. */
static uint64_t compare_buffers(const uint8_t *a, const uint8_t *b, uint64_t n,
                                bool *differ)
{
    uint64_t i = BI_MIN(n, SECTOR);
    bool res = memcmp(a, b, i) != 0;
    while (i < n) {
        uint64_t len = BI_MIN(n - i, SECTOR);
        if ((memcmp(a + i, b + i, len) != 0) != res) {
            break;
        }
        i += len;
    }
    *differ = res;
    return i;
}

static int check_empty(bi_node *n, uint64_t off, uint64_t len,
                       const char *fname, uint8_t *buf)
{
    int ret = bi_pread(n, off, buf, len);
    if (ret < 0) {
        cv_err("Error while reading offset %" PRIu64 " of %s: %s", off, fname,
               strerror(-ret));
        return 4;
    }
    int64_t idx = find_nonzero(buf, len);
    if (idx >= 0) {
        qprintf("Content mismatch at offset %" PRIu64 "!\n",
                off + (uint64_t)idx);
        return 1;
    }
    return 0;
}

int img_compare(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"image-opts", no_argument, NULL, 256},
        {"force-share", no_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    const char *fmt1 = NULL, *fmt2 = NULL, *cache = "writeback";
    bool progress = false, strict = false, image_opts = false;
    bool force_share = false;
    enum bi_cache bc;
    bi_node *n1 = NULL, *n2 = NULL;
    uint8_t *buf1 = NULL, *buf2 = NULL;
    struct bi_progress prog;
    int ret = 1, c;

    quiet = false;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hf:F:T:pqsU", long_opts, NULL)) !=
           -1) {
        switch (c) {
        case ':':
        case '?':
            cv_getopt_error(argv, c);
            return 1;
        case 'h':
            printf("usage: %s compare [--object objectdef] [--image-opts] "
                   "[-f fmt] [-F fmt] [-T src_cache] [-p] [-q] [-s] [-U] "
                   "filename1 filename2\n",
                   program_invocation_short_name);
            return 0;
        case 'f':
            fmt1 = optarg;
            break;
        case 'F':
            fmt2 = optarg;
            break;
        case 'T':
            cache = optarg;
            break;
        case 'p':
            progress = true;
            break;
        case 'q':
            quiet = true;
            break;
        case 's':
            strict = true;
            break;
        case 'U':
            force_share = true;
            break;
        case 256:
            image_opts = true;
            break;
        }
    }
    if (quiet) {
        progress = false;
    }
    if (optind != argc - 2) {
        return cv_err_exit("Expecting two image file names");
    }
    const char *f1 = argv[optind], *f2 = argv[optind + 1];

    bi_progress_init(&prog, progress ? BI_PROGRESS_QEMU : BI_PROGRESS_NONE,
                     2.0f, "compare");
    if (bi_cache_parse(cache, &bc) < 0) {
        cv_err("Invalid source cache option: %s", cache);
        ret = 2;
        goto out;
    }
    n1 = cv_open(f1, fmt1, image_opts, bc, false, force_share, true);
    if (!n1) {
        ret = 2;
        goto out;
    }
    n2 = cv_open(f2, fmt2, image_opts, bc, false, force_share, true);
    if (!n2) {
        ret = 2;
        goto out;
    }
    buf1 = bi_blockalign(n1, IO_BUF);
    buf2 = bi_blockalign(n2, IO_BUF);
    if (!buf1 || !buf2) {
        cv_err("Could not allocate buffers: %s", strerror(ENOMEM));
        ret = 4;
        goto out;
    }
    int64_t s1 = bi_getlength(n1), s2 = bi_getlength(n2);
    if (s1 < 0) {
        cv_err("Can't get size of %s: %s", f1, strerror((int)-s1));
        ret = 4;
        goto out;
    }
    if (s2 < 0) {
        cv_err("Can't get size of %s: %s", f2, strerror((int)-s2));
        ret = 4;
        goto out;
    }
    uint64_t total = (uint64_t)BI_MIN(s1, s2);
    uint64_t base = (uint64_t)BI_MAX(s1, s2);
    uint64_t off = 0;
    bi_progress_print(&prog, 0, 100);

    if (strict && s1 != s2) {
        ret = 1;
        qprintf("Strict mode: Image size mismatch!\n");
        goto out;
    }

    while (off < total) {
        struct bi_status st1, st2;
        memset(&st1, 0, sizeof(st1));
        memset(&st2, 0, sizeof(st2));
        if (bi_block_status_above(n1, NULL, off, (uint64_t)s1 - off, &st1) <
            0) {
            ret = 3;
            cv_err("Sector allocation test failed for %s", f1);
            goto out;
        }
        if (bi_block_status_above(n2, NULL, off, (uint64_t)s2 - off, &st2) <
            0) {
            ret = 3;
            cv_err("Sector allocation test failed for %s", f2);
            goto out;
        }
        bool a1 = st1.flags & BI_BS_ALLOCATED, a2 = st2.flags & BI_BS_ALLOCATED;
        uint64_t chunk = BI_MIN(st1.len, st2.len);
        if (chunk == 0) {
            chunk = total - off;
        }
        chunk = BI_MIN(chunk, total - off);
        if (strict && (st1.flags & STRICT_MASK) != (st2.flags & STRICT_MASK)) {
            ret = 1;
            qprintf("Strict mode: Offset %" PRIu64 " block status mismatch!\n",
                    off);
            goto out;
        }
        if ((st1.flags & BI_BS_ZERO) && (st2.flags & BI_BS_ZERO)) {
            /* nothing to read */
        } else if (a1 == a2) {
            if (a1) {
                chunk = BI_MIN(chunk, IO_BUF);
                int r = bi_pread(n1, off, buf1, chunk);
                if (r < 0) {
                    cv_err("Error while reading offset %" PRIu64 " of %s: %s",
                           off, f1, strerror(-r));
                    ret = 4;
                    goto out;
                }
                r = bi_pread(n2, off, buf2, chunk);
                if (r < 0) {
                    cv_err("Error while reading offset %" PRIu64 " of %s: %s",
                           off, f2, strerror(-r));
                    ret = 4;
                    goto out;
                }
                bool differ;
                uint64_t pnum = compare_buffers(buf1, buf2, chunk, &differ);
                if (differ || pnum != chunk) {
                    qprintf("Content mismatch at offset %" PRIu64 "!\n",
                            off + (differ ? 0 : pnum));
                    ret = 1;
                    goto out;
                }
            }
        } else {
            chunk = BI_MIN(chunk, IO_BUF);
            int r = a1 ? check_empty(n1, off, chunk, f1, buf1)
                       : check_empty(n2, off, chunk, f2, buf1);
            if (r) {
                ret = r;
                goto out;
            }
        }
        off += chunk;
        bi_progress_print(&prog, ((float)chunk / (float)base) * 100, 100);
    }

    if (s1 != s2) {
        bi_node *over = s1 > s2 ? n1 : n2;
        const char *fo = s1 > s2 ? f1 : f2;
        qprintf("Warning: Image size mismatch!\n");
        while (off < base) {
            struct bi_status st;
            memset(&st, 0, sizeof(st));
            if (bi_block_status_above(over, NULL, off, base - off, &st) < 0) {
                ret = 3;
                cv_err("Sector allocation test failed for %s", fo);
                goto out;
            }
            uint64_t chunk = st.len ? BI_MIN(st.len, base - off) : base - off;
            if ((st.flags & BI_BS_ALLOCATED) && !(st.flags & BI_BS_ZERO)) {
                chunk = BI_MIN(chunk, IO_BUF);
                int r = check_empty(over, off, chunk, fo, buf1);
                if (r) {
                    ret = r;
                    goto out;
                }
            }
            off += chunk;
            bi_progress_print(&prog, ((float)chunk / (float)base) * 100, 100);
        }
    }
    qprintf("Images are identical.\n");
    ret = 0;

out:
    bi_free_aligned(buf1);
    bi_free_aligned(buf2);
    if (n2) {
        bi_close(n2, NULL);
    }
    if (n1) {
        bi_close(n1, NULL);
    }
    bi_progress_end(&prog);
    return ret;
}
