/* SPDX-License-Identifier: MIT */
/*
 * blkimg commit: qemu-img commit compatible. Copies what is allocated in
 * the image and the images between it and the base (its backing file, or
 * -b) into the base, growing the base if it is shorter, then empties the
 * image (every cluster unallocated) unless -d or -b.
 *
 * The chain is first opened as qemu-img opens it (same errors), then each
 * layer is opened on its own: the layers above the base read-only, the
 * base read-write.
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
#include <time.h>

void cv_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cv_err_exit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cv_getopt_error(char **argv, int c);
bi_node *cv_open(const char *filename, const char *fmt, bool image_opts,
                 enum bi_cache cache, bool rw, bool force_share,
                 bool quiet_probe);
int cv_parse_image_opts(const char *s, struct bi_open_opts *o,
                        const char **filename, char ***owned);
void cv_free_strv(char **v);

#define CM_BUF_SIZE (2 * 1024 * 1024)
#define CM_MAX_CHAIN 64

struct layer {
    char *path;   /* as opened */
    char *format; /* driver name */
    char *stored; /* the backing name its overlay records ("" for top) */
    bi_node *node;
    int64_t size;
};

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

static bool same_file(const char *a, const char *b)
{
    char ra[PATH_MAX], rb[PATH_MAX];
    return a && b && realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

static void free_layers(struct layer *l, int n)
{
    bi_error err;
    for (int i = n - 1; i >= 0; i--) {
        if (l[i].node) {
            bi_error_init(&err);
            bi_close(l[i].node, &err);
        }
        free(l[i].path);
        free(l[i].format);
        free(l[i].stored);
    }
}

/* Layer index holding [off, ...) above the base (layer nb): sets *len to
 * the run length and *zero when it reads as zeroes; -1 if unallocated. */
static int find_layer(struct layer *l, int nb, uint64_t off, uint64_t *len,
                      bool *zero, int *err)
{
    for (int i = 0; i < nb; i++) {
        struct bi_status st;
        if ((int64_t)off >= l[i].size) {
            /* beyond a short layer: zeroes allocated there, as QEMU */
            *zero = true;
            return i;
        }
        *len = BI_MIN(*len, (uint64_t)l[i].size - off);
        int r = bi_block_status(l[i].node, off, *len, &st);
        if (r < 0) {
            *err = r;
            return -1;
        }
        *len = BI_MIN(*len, st.len);
        if (st.flags & BI_BS_ALLOCATED) {
            *zero = (st.flags & BI_BS_ZERO) != 0;
            return i;
        }
    }
    return -1;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int do_commit(struct layer *l, int nb, uint64_t rate,
                     struct bi_progress *prog)
{
    bi_node *base = l[nb].node;
    int64_t size = l[0].size;
    uint64_t total = 0, done = 0, n;
    bool zero;
    int err = 0, ret = 0;

    if (size > l[nb].size) {
        bi_error e;
        bi_error_init(&e);
        ret = bi_truncate(base, (uint64_t)size, false, BI_PREALLOC_OFF, &e);
        if (ret < 0) {
            cv_err("%s", e.msg);
            return ret;
        }
    }
    /* what the job has to move */
    for (uint64_t off = 0; off < (uint64_t)size; off += n) {
        n = (uint64_t)size - off;
        int i = find_layer(l, nb, off, &n, &zero, &err);
        if (err < 0)
            goto io_error;
        if (i >= 0)
            total += n;
    }
    uint8_t *buf = bi_blockalign(base, CM_BUF_SIZE);
    if (!buf)
        return -ENOMEM;
    uint64_t start = now_ns();
    for (uint64_t off = 0; off < (uint64_t)size; off += n) {
        n = BI_MIN((uint64_t)CM_BUF_SIZE, (uint64_t)size - off);
        int i = find_layer(l, nb, off, &n, &zero, &err);
        if (err < 0)
            break;
        if (i < 0)
            continue;
        if (zero) {
            /* the commit job unmaps, as QEMU's (mirror with unmap=true) */
            ret = bi_pwrite_zeroes(base, off, n, BI_REQ_MAY_UNMAP);
        } else {
            ret = bi_pread(l[i].node, off, buf, n);
            if (ret < 0) {
                err = ret;
                break;
            }
            ret = bi_pwrite(base, off, buf, n, 0);
        }
        if (ret < 0) {
            err = ret;
            break;
        }
        done += n;
        if (rate && !zero) {
            /* qemu's rate limit counts the bytes moved */
            uint64_t due = start + done * 1000000000ull / rate;
            uint64_t t = now_ns();
            if (due > t) {
                struct timespec ts = {(time_t)((due - t) / 1000000000ull),
                                      (long)((due - t) % 1000000000ull)};
                nanosleep(&ts, NULL);
            }
        }
        bi_progress_print(prog, total ? (float)done / (float)total * 100.f : 0,
                          0);
    }
    bi_free_aligned(buf);
    if (err == 0)
        err = bi_flush(base);
    if (err == 0)
        return 0;
io_error:
    cv_err("Input/output error");
    BI_UNUSED(ret);
    return err;
}

int img_commit(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"object", required_argument, NULL, 256},
        {"image-opts", no_argument, NULL, 257},
        {NULL, 0, NULL, 0},
    };
    const char *fmt = NULL, *cache = "writeback", *base = NULL;
    bool progress = false, quiet = false, image_opts = false, drop = false;
    uint64_t rate = 0;
    enum bi_cache cmode;
    struct layer l[CM_MAX_CHAIN];
    int nl = 0, nb = -1, c;
    struct bi_progress prog;
    bi_node *top;
    bi_error err;
    const char *failed = NULL;
    char msg[2048];

    memset(l, 0, sizeof(l));
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":f:ht:b:dpqr:", long_opts, NULL)) !=
           -1) {
        switch (c) {
        case ':':
        case '?':
            cv_getopt_error(argv, c);
            return 1;
        case 'h':
            printf("usage: %s commit [--object objectdef] [--image-opts] [-q] "
                   "[-f fmt] [-t cache] [-b base] [-r rate_limit] [-d] [-p] "
                   "filename\n",
                   program_invocation_short_name);
            return 0;
        case 'f':
            fmt = optarg;
            break;
        case 't':
            cache = optarg;
            break;
        case 'b':
            base = optarg;
            /* -b implies -d */
            drop = true;
            break;
        case 'd':
            drop = true;
            break;
        case 'p':
            progress = true;
            break;
        case 'q':
            quiet = true;
            break;
        case 'r': {
            int r = bi_parse_size(optarg, &rate);
            if (r < 0 || rate > INT64_MAX) {
                cv_err("Invalid rate limit specified. You may use k, M, G, "
                       "T, P or E suffixes for");
                cv_err("kilobytes, megabytes, gigabytes, terabytes, "
                       "petabytes and exabytes.");
                return 1;
            }
            break;
        }
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
    const char *filename = argv[optind];
    if (bi_cache_parse(cache, &cmode) < 0) {
        cv_err("Invalid cache option: %s", cache);
        return 1;
    }

    /* the whole chain as qemu-img opens it: its errors, its layers */
    top = cv_open(filename, fmt, image_opts, cmode, true, false, false);
    if (!top)
        return 1;
    char *stored = strdup("");
    for (bi_node *n = top; n && nl < CM_MAX_CHAIN; n = bi_node_backing(n)) {
        struct bi_image_info info;
        bi_error_init(&err);
        if (bi_get_info(n, &info, &err) < 0) {
            cv_err("%s", err.msg);
            free(stored);
            bi_close(top, &err);
            free_layers(l, nl);
            return 1;
        }
        l[nl].path = strdup(bi_node_filename(n));
        l[nl].format = strdup(bi_node_format(n));
        l[nl].stored = stored;
        stored = strdup(info.backing_filename);
        bi_info_free(&info);
        nl++;
    }
    free(stored);
    bi_error_init(&err);
    bi_close(top, &err);

    bi_progress_init(&prog, progress ? BI_PROGRESS_QEMU : BI_PROGRESS_NONE,
                     1.0f, "commit");
    bi_progress_print(&prog, 0, 100);

    if (base) {
        for (int i = 1; i < nl && nb < 0; i++) {
            char *full = resolve_backing(l[i - 1].path, base);
            if ((l[i].stored && !strcmp(base, l[i].stored)) ||
                !strcmp(base, l[i].path) || same_file(full, l[i].path))
                nb = i;
            free(full);
        }
        if (nb < 0) {
            snprintf(msg, sizeof(msg),
                     "Did not find '%s' in the backing chain of '%s'", base,
                     filename);
            failed = msg;
            goto done;
        }
    } else {
        if (nl < 2) {
            failed = "Image does not have a backing file";
            goto done;
        }
        nb = 1;
    }

    /* each layer on its own: above the base read-only, the base writable */
    for (int i = 0; i <= nb; i++) {
        struct bi_open_opts o;
        bi_open_opts_init(&o);
        o.format = l[i].format;
        o.cache = cmode;
        o.backing_cache = cmode;
        o.read_write = i == 0 || i == nb;
        o.no_backing = true;
        o.quiet_probe = true;
        bi_error_init(&err);
        l[i].node = bi_open(l[i].path, &o, &err);
        if (!l[i].node) {
            snprintf(msg, sizeof(msg), "%s", err.msg);
            failed = msg;
            goto done;
        }
        l[i].size = bi_getlength(l[i].node);
        if (l[i].size < 0) {
            snprintf(msg, sizeof(msg), "Could not get size of '%s': %s",
                     l[i].path, strerror((int)-l[i].size));
            failed = msg;
            goto done;
        }
    }
    if (do_commit(l, nb, rate, &prog) < 0) {
        bi_progress_end(&prog);
        free_layers(l, nl);
        return 1;
    }
    bi_progress_print(&prog, 100, 0);
    if (!drop) {
        bi_error_init(&err);
        int r = bi_make_empty(l[0].node, &err);
        if (r < 0 && r != -ENOTSUP) {
            snprintf(msg, sizeof(msg), "%s", err.msg);
            failed = msg;
        }
    }
done:
    bi_progress_end(&prog);
    for (int i = nl - 1; i >= 0; i--) {
        if (l[i].node) {
            bi_error_init(&err);
            if (bi_close(l[i].node, &err) < 0 && !failed) {
                snprintf(msg, sizeof(msg), "%s", err.msg);
                failed = msg;
            }
            l[i].node = NULL;
        }
    }
    free_layers(l, nl);
    if (failed) {
        cv_err("%s", failed);
        return 1;
    }
    if (!quiet)
        printf("Image committed.\n");
    return 0;
}
