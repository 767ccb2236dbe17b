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
#include "common.h"
#include "img.h"
#include "progress.h"
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

/*
 * The walk is qemu-img's, step by step in offset order, but the reads run
 * ahead: up to NSLOT steps are planned (block status) and their reads are
 * in flight on both images at once, while the oldest step is checked. Every
 * verdict (mismatch, status or read error, strict-mode difference) is
 * still reported in offset order, so the first difference found is the one
 * qemu-img reports.
 */
#define NSLOT 8

enum step_kind {
    ST_SKIP,   /* zero in both: nothing to read */
    ST_DATA,   /* allocated in both: read both and compare */
    ST_ONE,    /* allocated in one only (or past the shorter image's end):
                * that side must read as zeroes */
    ST_WARN,   /* "Warning: Image size mismatch!" */
    ST_STRICT, /* -s: block status differs here */
    ST_STATUS, /* block status failed for file */
};

struct step {
    enum step_kind kind;
    uint64_t off, len;
    bi_node *node; /* ST_ONE: the side to check */
    const char *file;
    uint8_t *b1, *b2;
    /* the requests' vectors, which live until their callbacks run */
    struct iovec iov1, iov2;
    int pending;
    int r1, r2;
};

struct walk {
    bi_node *n1, *n2;
    const char *f1, *f2;
    int64_t s1, s2;
    uint64_t total, base, off;
    bool strict, warned, done;
    struct step slot[NSLOT];
    int head, count;
};

static void read1_done(void *opaque, int ret)
{
    struct step *st = opaque;
    st->r1 = ret;
    st->pending--;
}

static void read2_done(void *opaque, int ret)
{
    struct step *st = opaque;
    st->r2 = ret;
    st->pending--;
}

static void submit_read(bi_node *n, struct step *st, uint8_t *buf,
                        bi_aio_cb *cb)
{
    struct iovec *iov = buf == st->b1 ? &st->iov1 : &st->iov2;
    *iov = (struct iovec){buf, st->len};
    st->pending++;
    bi_aio_preadv(n, st->off, iov, 1, cb, st);
}

/* Plans the next step at w->off into st and starts its reads; false when
 * the walk is over. */
static bool plan_step(struct walk *w, struct step *st)
{
    st->pending = 0;
    st->r1 = st->r2 = 0;
    st->node = NULL;
    if (w->done) {
        return false;
    }
    if (w->off < w->total) {
        struct bi_status a, b;
        memset(&a, 0, sizeof(a));
        memset(&b, 0, sizeof(b));
        st->off = w->off;
        st->len = 0;
        if (bi_block_status_above(w->n1, NULL, w->off, (uint64_t)w->s1 - w->off,
                                  &a) < 0) {
            st->kind = ST_STATUS;
            st->file = w->f1;
            w->done = true;
            return true;
        }
        if (bi_block_status_above(w->n2, NULL, w->off, (uint64_t)w->s2 - w->off,
                                  &b) < 0) {
            st->kind = ST_STATUS;
            st->file = w->f2;
            w->done = true;
            return true;
        }
        bool a1 = a.flags & BI_BS_ALLOCATED, a2 = b.flags & BI_BS_ALLOCATED;
        uint64_t chunk = BI_MIN(a.len, b.len);
        if (chunk == 0) {
            chunk = w->total - w->off;
        }
        chunk = BI_MIN(chunk, w->total - w->off);
        if (w->strict && (a.flags & STRICT_MASK) != (b.flags & STRICT_MASK)) {
            st->kind = ST_STRICT;
            w->done = true;
            return true;
        }
        if ((a.flags & BI_BS_ZERO) && (b.flags & BI_BS_ZERO)) {
            st->kind = ST_SKIP;
        } else if (a1 == a2) {
            st->kind = a1 ? ST_DATA : ST_SKIP;
        } else {
            st->kind = ST_ONE;
            st->node = a1 ? w->n1 : w->n2;
            st->file = a1 ? w->f1 : w->f2;
        }
        if (st->kind != ST_SKIP) {
            chunk = BI_MIN(chunk, IO_BUF);
        }
        st->len = chunk;
        w->off += chunk;
        if (st->kind == ST_DATA) {
            submit_read(w->n1, st, st->b1, read1_done);
            submit_read(w->n2, st, st->b2, read2_done);
        } else if (st->kind == ST_ONE) {
            submit_read(st->node, st, st->b1, read1_done);
        }
        return true;
    }
    if (w->s1 == w->s2 || w->off >= w->base) {
        w->done = true;
        return false;
    }
    if (!w->warned) {
        w->warned = true;
        st->kind = ST_WARN;
        st->off = w->off;
        st->len = 0;
        return true;
    }
    /* past the shorter image: the longer one must read as zeroes */
    bi_node *over = w->s1 > w->s2 ? w->n1 : w->n2;
    struct bi_status a;
    memset(&a, 0, sizeof(a));
    st->off = w->off;
    st->file = w->s1 > w->s2 ? w->f1 : w->f2;
    if (bi_block_status_above(over, NULL, w->off, w->base - w->off, &a) < 0) {
        st->kind = ST_STATUS;
        st->len = 0;
        w->done = true;
        return true;
    }
    uint64_t chunk = a.len ? BI_MIN(a.len, w->base - w->off) : w->base - w->off;
    if ((a.flags & BI_BS_ALLOCATED) && !(a.flags & BI_BS_ZERO)) {
        st->kind = ST_ONE;
        st->node = over;
        chunk = BI_MIN(chunk, IO_BUF);
    } else {
        st->kind = ST_SKIP;
    }
    st->len = chunk;
    w->off += chunk;
    if (st->kind == ST_ONE) {
        submit_read(over, st, st->b1, read1_done);
    }
    return true;
}

/* The verdict of a finished step: 0 to go on, else the exit code. */
static int check_step(struct walk *w, struct step *st)
{
    switch (st->kind) {
    case ST_SKIP:
        return 0;
    case ST_WARN:
        qprintf("Warning: Image size mismatch!\n");
        return 0;
    case ST_STRICT:
        qprintf("Strict mode: Offset %" PRIu64 " block status mismatch!\n",
                st->off);
        return 1;
    case ST_STATUS:
        cv_err("Sector allocation test failed for %s", st->file);
        return 3;
    case ST_ONE: {
        if (st->r1 < 0) {
            cv_err("Error while reading offset %" PRIu64 " of %s: %s", st->off,
                   st->file, strerror(-st->r1));
            return 4;
        }
        int64_t idx = find_nonzero(st->b1, st->len);
        if (idx >= 0) {
            qprintf("Content mismatch at offset %" PRIu64 "!\n",
                    st->off + (uint64_t)idx);
            return 1;
        }
        return 0;
    }
    case ST_DATA: {
        if (st->r1 < 0 || st->r2 < 0) {
            cv_err("Error while reading offset %" PRIu64 " of %s: %s", st->off,
                   st->r1 < 0 ? w->f1 : w->f2,
                   strerror(st->r1 < 0 ? -st->r1 : -st->r2));
            return 4;
        }
        bool differ;
        uint64_t pnum = compare_buffers(st->b1, st->b2, st->len, &differ);
        if (differ || pnum != st->len) {
            qprintf("Content mismatch at offset %" PRIu64 "!\n",
                    st->off + (differ ? 0 : pnum));
            return 1;
        }
        return 0;
    }
    }
    return 0;
}

/* Runs the walk; returns the exit code (0: identical). */
static int run_walk(struct walk *w, struct bi_progress *prog)
{
    int ret = 0;
    for (;;) {
        while (w->count < NSLOT) {
            struct step *st = &w->slot[(w->head + w->count) % NSLOT];
            if (!plan_step(w, st)) {
                break;
            }
            w->count++;
        }
        if (w->count == 0) {
            break;
        }
        struct step *st = &w->slot[w->head];
        while (st->pending > 0) {
            bi_aio_poll(true);
        }
        ret = check_step(w, st);
        if (ret) {
            break;
        }
        if (st->len) {
            bi_progress_print(prog, ((float)st->len / (float)w->base) * 100,
                              100);
        }
        w->head = (w->head + 1) % NSLOT;
        w->count--;
    }
    /* reads still in flight land in buffers freed only after this */
    bi_aio_drain();
    return ret;
}

int img_compare(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"image-opts", no_argument, NULL, 256},
        {"object", required_argument, NULL, 300},
        {"force-share", no_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    const char *fmt1 = NULL, *fmt2 = NULL, *cache = "writeback";
    bool progress = false, strict = false, image_opts = false;
    bool force_share = false;
    enum bi_cache bc;
    bi_node *n1 = NULL, *n2 = NULL;
    struct walk *w = NULL;
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
        case 300:
            if (tool_object_add(optarg) < 0) {
                return 1;
            }
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
    w = bi_xzalloc(sizeof(*w));
    for (int i = 0; i < NSLOT; i++) {
        w->slot[i].b1 = bi_blockalign(n1, IO_BUF);
        w->slot[i].b2 = bi_blockalign(n2, IO_BUF);
        if (!w->slot[i].b1 || !w->slot[i].b2) {
            cv_err("Could not allocate buffers: %s", strerror(ENOMEM));
            ret = 4;
            goto out;
        }
    }
    w->n1 = n1;
    w->n2 = n2;
    w->f1 = f1;
    w->f2 = f2;
    w->s1 = s1;
    w->s2 = s2;
    w->total = (uint64_t)BI_MIN(s1, s2);
    w->base = (uint64_t)BI_MAX(s1, s2);
    w->strict = strict;
    bi_progress_print(&prog, 0, 100);

    if (strict && s1 != s2) {
        ret = 1;
        qprintf("Strict mode: Image size mismatch!\n");
        goto out;
    }
    ret = run_walk(w, &prog);
    if (ret == 0) {
        qprintf("Images are identical.\n");
    }

out:
    for (int i = 0; w && i < NSLOT; i++) {
        bi_free_aligned(w->slot[i].b1);
        bi_free_aligned(w->slot[i].b2);
    }
    free(w);
    if (n2) {
        bi_close(n2, NULL);
    }
    if (n1) {
        bi_close(n1, NULL);
    }
    bi_progress_end(&prog);
    return ret;
}
