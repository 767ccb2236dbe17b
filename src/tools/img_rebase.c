/* SPDX-License-Identifier: MIT */
/*
 * blkimg rebase: qemu-img rebase compatible. Safe mode copies into the
 * image every range that is unallocated in it and reads differently in the
 * old and the new backing file, then records the new backing file; -u only
 * rewrites the header.
 */
#include "blkimg/blkimg.h"
#include "blkimg/convert.h"
#include "blkimg/image_ops.h"
#include "img.h"
#include "util/util.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cv_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cv_err_exit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cv_getopt_error(char **argv, int c);
int cv_parse_image_opts(const char *s, struct bi_open_opts *o,
                        const char **filename, char ***owned);
void cv_free_strv(char **v);
const char *strip_file_prefix(const char *msg, const char *file);

#define RB_BUF_SIZE (2 * 1024 * 1024) /* qemu-img's IO_BUF_SIZE */
#define RB_SECTOR 512

static bi_node *rb_open(const char *filename, const char *fmt, bool image_opts,
                        enum bi_cache cache, bool no_backing)
{
    struct bi_open_opts o;
    bi_error err;
    char **owned = NULL;
    const char *fname = filename;
    bi_open_opts_init(&o);
    o.format = fmt;
    o.cache = cache;
    o.backing_cache = cache;
    o.read_write = true;
    o.no_backing = no_backing;
    if (image_opts) {
        if (fmt) {
            cv_err("--image-opts and --format are mutually exclusive");
            return NULL;
        }
        if (cv_parse_image_opts(filename, &o, &fname, &owned) < 0)
            return NULL;
    }
    bi_error_init(&err);
    bi_node *n = bi_open(fname, &o, &err);
    if (!n)
        cv_err("%s", err.msg);
    cv_free_strv(owned);
    return n;
}

/* The backing name as QEMU resolves it against the overlay's file name. */
static char *resolve_backing(const char *overlay, const char *backing)
{
    const char *slash = strrchr(overlay, '/');
    char *r;
    if (backing[0] == '/' || !slash)
        return strdup(backing);
    if (asprintf(&r, "%.*s%s", (int)(slash - overlay + 1), overlay, backing) <
        0)
        return NULL;
    return r;
}

/* The node of n's backing chain whose file is path, or NULL. */
static bi_node *find_in_chain(bi_node *n, const char *path)
{
    char want[PATH_MAX], have[PATH_MAX];
    if (!realpath(path, want))
        return NULL;
    for (bi_node *b = bi_node_backing(n); b; b = bi_node_backing(b)) {
        const char *f = bi_node_filename(b);
        if (f && realpath(f, have) && !strcmp(want, have))
            return b;
    }
    return NULL;
}

/* qemu-img's compare_buffers(): whether the first sector differs, and in
 * *pnum how many bytes from the start share that state (sector steps). */
static bool compare_buffers(const uint8_t *a, const uint8_t *b, uint64_t len,
                            uint64_t *pnum)
{
    uint64_t i = BI_MIN(len, (uint64_t)RB_SECTOR);
    bool res = memcmp(a, b, i) != 0;
    while (i < len) {
        uint64_t l = BI_MIN(len - i, (uint64_t)RB_SECTOR);
        if ((memcmp(a + i, b + i, l) != 0) != res)
            break;
        i += l;
    }
    *pnum = i;
    return res;
}

static int rb_copy(bi_node *top, bi_node *old_b, bi_node *new_b,
                   bi_node *prefix, const char *filename,
                   const char *out_baseimg, struct bi_progress *prog)
{
    int64_t size = bi_getlength(top), old_size = 0, new_size = 0;
    uint8_t *buf_old = NULL, *buf_new = NULL;
    int ret = -1;
    if (size < 0) {
        cv_err("Could not get size of '%s': %s", filename,
               strerror((int)-size));
        return -1;
    }
    if (old_b) {
        old_size = bi_getlength(old_b);
        if (old_size < 0) {
            cv_err("Could not get size of '%s': %s", bi_node_filename(old_b),
                   strerror((int)-old_size));
            return -1;
        }
    }
    if (new_b) {
        new_size = bi_getlength(new_b);
        if (new_size < 0) {
            cv_err("Could not get size of '%s': %s", out_baseimg,
                   strerror((int)-new_size));
            return -1;
        }
    }
    buf_old = bi_blockalign(top, RB_BUF_SIZE);
    buf_new = bi_blockalign(top, RB_BUF_SIZE);
    if (!buf_old || !buf_new) {
        cv_err("Could not allocate buffers: %s", strerror(ENOMEM));
        goto out;
    }
    float step = 0;
    if (size != 0)
        step = (float)100 / (float)(size / BI_MIN(size, (int64_t)RB_BUF_SIZE));
    uint64_t n;
    for (uint64_t off = 0; off < (uint64_t)size; off += n) {
        bool old_zero = false;
        struct bi_status st;
        n = BI_MIN((uint64_t)RB_BUF_SIZE, (uint64_t)size - off);
        int r = bi_block_status(top, off, n, &st);
        if (r < 0) {
            cv_err("error while reading image metadata: %s", strerror(-r));
            goto out;
        }
        n = BI_MIN(n, st.len);
        if (st.flags & BI_BS_ALLOCATED)
            continue;
        if (prefix) {
            r = bi_block_status_above(old_b, prefix, off, n, &st);
            if (r < 0) {
                cv_err("error while reading image metadata: %s", strerror(-r));
                goto out;
            }
            n = BI_MIN(n, st.len);
            if (!(st.flags & BI_BS_ALLOCATED))
                continue;
        }
        if ((int64_t)off >= old_size) {
            memset(buf_old, 0, n);
            old_zero = true;
        } else {
            if ((int64_t)(off + n) > old_size)
                n = (uint64_t)old_size - off;
            if (bi_pread(old_b, off, buf_old, n) < 0) {
                cv_err("error while reading from old backing file");
                goto out;
            }
        }
        if (!new_b || (int64_t)off >= new_size) {
            memset(buf_new, 0, n);
        } else {
            if ((int64_t)(off + n) > new_size)
                n = (uint64_t)new_size - off;
            if (bi_pread(new_b, off, buf_new, n) < 0) {
                cv_err("error while reading from new backing file");
                goto out;
            }
        }
        uint64_t done = 0;
        while (done < n) {
            uint64_t pnum;
            if (compare_buffers(buf_old + done, buf_new + done, n - done,
                                &pnum)) {
                if (old_zero)
                    r = bi_pwrite_zeroes(top, off + done, pnum, 0);
                else
                    r = bi_pwrite(top, off + done, buf_old + done, pnum, 0);
                if (r < 0) {
                    cv_err("Error while writing to COW image: %s",
                           strerror(-r));
                    goto out;
                }
            }
            done += pnum;
        }
        bi_progress_print(prog, step, 100);
    }
    ret = 0;
out:
    bi_free_aligned(buf_old);
    bi_free_aligned(buf_new);
    return ret;
}

int img_rebase(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"object", required_argument, NULL, 256},
        {"image-opts", no_argument, NULL, 257},
        {"force-share", no_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    const char *fmt = NULL, *cache = "writeback", *src_cache = "writeback";
    const char *out_baseimg = NULL, *out_basefmt = NULL;
    bool unsafe = false, progress = false, quiet = false, image_opts = false;
    bool force_share = false;
    enum bi_cache cmode, smode;
    bi_node *top = NULL, *new_b = NULL, *prefix = NULL;
    struct bi_progress prog;
    bi_error err;
    int c, ret = -1;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hf:F:b:upt:T:qU", long_opts, NULL)) !=
           -1) {
        switch (c) {
        case ':':
        case '?':
            cv_getopt_error(argv, c);
            return 1;
        case 'h':
            printf("usage: %s rebase [--object objectdef] [--image-opts] [-U] "
                   "[-q] [-f fmt] [-t cache] [-T src_cache] [-p] [-u] "
                   "-b backing_file [-F backing_fmt] filename\n",
                   program_invocation_short_name);
            return 0;
        case 'f':
            fmt = optarg;
            break;
        case 'F':
            out_basefmt = optarg;
            break;
        case 'b':
            out_baseimg = optarg;
            break;
        case 'u':
            unsafe = true;
            break;
        case 'p':
            progress = true;
            break;
        case 't':
            cache = optarg;
            break;
        case 'T':
            src_cache = optarg;
            break;
        case 'q':
            quiet = true;
            break;
        case 'U':
            force_share = true;
            break;
        case 256:
            cv_err("--object is not supported");
            return 1;
        case 257:
            image_opts = true;
            break;
        }
    }
    if (quiet)
        progress = false;
    if (optind != argc - 1)
        return cv_err_exit("Expecting one image file name");
    if (!unsafe && !out_baseimg)
        return cv_err_exit("Must specify backing file (-b) or use unsafe "
                           "mode (-u)");
    const char *filename = argv[optind];

    bi_progress_init(&prog, progress ? BI_PROGRESS_QEMU : BI_PROGRESS_NONE,
                     2.0f, "rebase");
    bi_progress_print(&prog, 0, 100);

    if (bi_cache_parse(cache, &cmode) < 0) {
        cv_err("Invalid cache option: %s", cache);
        goto out;
    }
    if (bi_cache_parse(src_cache, &smode) < 0) {
        cv_err("Invalid source cache option: %s", src_cache);
        goto out;
    }
    top = rb_open(filename, fmt, image_opts, cmode, unsafe);
    if (!top)
        goto out;
    if (out_basefmt && bi_format_exists(out_basefmt) < 0) {
        cv_err("Invalid format name: '%s'", out_basefmt);
        goto out;
    }

    if (!unsafe) {
        bi_node *old_b = bi_node_backing(top);
        if (out_baseimg[0]) {
            char *path = resolve_backing(bi_node_filename(top), out_baseimg);
            if (!path) {
                cv_err("Could not resolve backing filename: %s",
                       strerror(ENOMEM));
                goto out;
            }
            prefix = find_in_chain(top, path);
            if (prefix) {
                new_b = prefix;
            } else {
                struct bi_open_opts o;
                bi_open_opts_init(&o);
                o.format = out_basefmt;
                o.cache = smode;
                o.backing_cache = smode;
                o.force_share = force_share;
                o.quiet_probe = true;
                bi_error_init(&err);
                new_b = bi_open(path, &o, &err);
                if (!new_b) {
                    /* the library says "Could not open 'p': " twice where
                     * qemu's blk_new_open says it once */
                    char pre[PATH_MAX + 32];
                    snprintf(pre, sizeof(pre), "Could not open '%s'", path);
                    cv_err("Could not open new backing file '%s': %s",
                           out_baseimg, strip_file_prefix(err.msg, pre));
                    free(path);
                    goto out;
                }
            }
            free(path);
        }
        if (rb_copy(top, old_b, new_b, prefix, filename, out_baseimg, &prog) <
            0)
            goto out;
    }

    bi_error_init(&err);
    int r;
    if (out_baseimg && out_baseimg[0])
        r = bi_change_backing_file(top, out_baseimg, out_basefmt, true, &err);
    else
        r = bi_change_backing_file(top, NULL, NULL, false, &err);
    if (r == -ENOSPC)
        cv_err("Could not change the backing file to '%s': No space left in "
               "the file header",
               out_baseimg);
    else if (r == -EINVAL && out_baseimg && !out_basefmt)
        cv_err("Could not change the backing file to '%s': backing format "
               "must be specified",
               out_baseimg);
    else if (r < 0)
        cv_err("Could not change the backing file to '%s': %s",
               out_baseimg ? out_baseimg : "(null)", strerror(-r));
    bi_progress_print(&prog, 100, 0);
    ret = r < 0 ? -1 : 0;
out:
    bi_progress_end(&prog);
    if (new_b && !prefix) {
        bi_error_init(&err);
        bi_close(new_b, &err);
    }
    if (top) {
        bi_error_init(&err);
        if (bi_close(top, &err) < 0 && ret == 0) {
            cv_err("%s", err.msg);
            ret = -1;
        }
    }
    return ret < 0 ? 1 : 0;
}
