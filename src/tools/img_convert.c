/* SPDX-License-Identifier: MIT */
/*
 * blkimg convert: qemu-img convert compatible front end of the copy engine
 * (bi_convert). Also holds the small helpers the other copy subcommands
 * (compare, measure, resize, dd) share: error reporting in qemu-img's
 * style, -o lists, --image-opts strings, opening images.
 */
#include "blkimg/blkimg.h"
#include "blkimg/convert.h"
#include "blkimg/qcow2.h"
#include "common.h"
#include "img.h"
#include "util/util.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Shared with img_compare.c, img_measure.c, img_resize.c, img_dd.c. */
void cv_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cv_err_exit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cv_missing_argument(const char *opt);
int cv_unrecognized_option(const char *opt);
void cv_getopt_error(char **argv, int c);
int cv_parse_image_opts(const char *s, struct bi_open_opts *o,
                        const char **filename, char ***owned);
void cv_free_strv(char **v);
char **cv_optlist_strv(const struct bi_optlist *l);
bi_node *cv_open(const char *filename, const char *fmt, bool image_opts,
                 enum bi_cache cache, bool rw, bool force_share,
                 bool quiet_probe);
bi_node *cv_open_opts(const char *filename, const char *fmt, bool image_opts,
                      struct bi_open_opts *o);
int cv_parse_rate(const char *arg, uint64_t *rate);

void cv_err(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", program_invocation_short_name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* qemu-img's error_exit(): the message and the --help hint, status 1. */
int cv_err_exit(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", program_invocation_short_name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s --help' for more information\n",
            program_invocation_short_name);
    return 1;
}

int cv_missing_argument(const char *opt)
{
    return cv_err_exit("missing argument for option '%s'", opt);
}

int cv_unrecognized_option(const char *opt)
{
    return cv_err_exit("unrecognized option '%s'", opt);
}

/* Reports a ':' or '?' from getopt_long (optstring starting with ':'). */
void cv_getopt_error(char **argv, int c)
{
    if (c == ':') {
        cv_missing_argument(argv[optind - 1]);
    } else {
        cv_unrecognized_option(argv[optind - 1]);
    }
}

void cv_free_strv(char **v)
{
    if (!v) {
        return;
    }
    for (char **p = v; *p; p++) {
        free(*p);
    }
    free(v);
}

/* "key=value" strings of an option list, NULL-terminated. */
char **cv_optlist_strv(const struct bi_optlist *l)
{
    char **v = bi_xzalloc(sizeof(char *) * (size_t)(l->n + 1));
    for (int i = 0; i < l->n; i++) {
        if (l->v[i].value) {
            v[i] = bi_xasprintf("%s=%s", l->v[i].key, l->v[i].value);
        } else {
            v[i] = bi_xstrdup(l->v[i].key);
        }
    }
    return v;
}

/* --image-opts: "driver=qcow2,file.filename=x.qcow2,l2-cache-size=1M". */
int cv_parse_image_opts(const char *s, struct bi_open_opts *o,
                        const char **filename, char ***owned)
{
    struct bi_optlist l;
    memset(&l, 0, sizeof(l));
    if (bi_optlist_parse(&l, s) < 0) {
        cv_err("Invalid option list: %s", s);
        return -EINVAL;
    }
    char **v = bi_xzalloc(sizeof(char *) * (size_t)(2 * l.n + 2));
    int nv = 0, nd = 0;
    char **drv = bi_xzalloc(sizeof(char *) * (size_t)(l.n + 1));
    const char *fname = NULL;
    for (int i = 0; i < l.n; i++) {
        const char *k = l.v[i].key, *val = l.v[i].value ? l.v[i].value : "on";
        if (!strcmp(k, "driver")) {
            v[nv] = bi_xstrdup(val);
            o->format = v[nv++];
        } else if (!strcmp(k, "file.filename") || !strcmp(k, "filename")) {
            v[nv] = bi_xstrdup(val);
            fname = v[nv++];
        } else if (!strcmp(k, "file.driver")) {
            if (strcmp(val, "file")) {
                cv_err("Unknown protocol '%s'", val);
                goto fail;
            }
        } else if (!strcmp(k, "cache.direct") || !strcmp(k, "file.aio") ||
                   !strcmp(k, "aio")) {
            /* cache mode comes from -t/-T; aio from the engine */
        } else {
            drv[nd++] = bi_xasprintf("%s=%s", k, val);
        }
    }
    if (!fname) {
        cv_err("Could not open '%s': A block device must be specified for "
               "\"file\"",
               s);
        goto fail;
    }
    *filename = fname;
    o->driver_opts = (const char *const *)drv;
    v[nv++] = (char *)drv; /* freed as one more pointer; entries below */
    for (int i = 0; i < nd; i++) {
        v[nv++] = drv[i];
    }
    *owned = v;
    bi_optlist_free(&l);
    return 0;
fail:
    for (int i = 0; i < nd; i++) {
        free(drv[i]);
    }
    free(drv);
    cv_free_strv(v);
    bi_optlist_free(&l);
    return -EINVAL;
}

/* -r: qemu-img's rate limit (size suffixes, at most INT64_MAX bytes/s);
 * 0, or -EINVAL with qemu-img's two lines printed. */
int cv_parse_rate(const char *arg, uint64_t *rate)
{
    if (bi_parse_size(arg, rate) < 0 || *rate > INT64_MAX) {
        cv_err("Invalid rate limit specified. You may use k, M, G, "
               "T, P or E suffixes for");
        cv_err("kilobytes, megabytes, gigabytes, terabytes, "
               "petabytes and exabytes.");
        return -EINVAL;
    }
    return 0;
}

/* Opens filename with o (o->format set from fmt) as qemu-img's img_open()
 * does: --image-opts parsed into o; prints the error. */
bi_node *cv_open_opts(const char *filename, const char *fmt, bool image_opts,
                      struct bi_open_opts *o)
{
    bi_error err;
    char **owned = NULL;
    const char *fname = filename;
    bi_node *n;

    o->format = fmt;
    o->named_by_options = image_opts;
    if (image_opts) {
        if (fmt) {
            cv_err("--image-opts and --format are mutually exclusive");
            return NULL;
        }
        if (cv_parse_image_opts(filename, o, &fname, &owned) < 0) {
            return NULL;
        }
    }
    bi_error_init(&err);
    n = bi_open(fname, o, &err);
    if (!n) {
        /* the library's message is qemu's whole line */
        cv_err("%s", err.msg);
    }
    /* The node keeps no pointer to option strings past open except the
     * format name, which the library copies; free ours. */
    cv_free_strv(owned);
    return n;
}

/* Opens an image as qemu-img's img_open() does; prints the error. */
bi_node *cv_open(const char *filename, const char *fmt, bool image_opts,
                 enum bi_cache cache, bool rw, bool force_share,
                 bool quiet_probe)
{
    struct bi_open_opts o;

    bi_open_opts_init(&o);
    o.cache = cache;
    o.backing_cache = cache;
    o.read_write = rw;
    o.force_share = force_share;
    o.quiet_probe = quiet_probe;
    return cv_open_opts(filename, fmt, image_opts, &o);
}

/* ---------------------------------------------------------------- convert */

static volatile sig_atomic_t cv_cancel;
static volatile sig_atomic_t cv_signal;

static void on_signal(int sig)
{
    cv_signal = sig;
    cv_cancel = 1;
}

static bool key_known(const char *fmt, const char *key)
{
    return bi_create_option_known(fmt, key);
}

/* bi_create's message starts with "<file>: " as qemu-img create prints it;
 * convert and dd put their own words between. */
const char *strip_file_prefix(const char *msg, const char *file);
const char *strip_file_prefix(const char *msg, const char *file)
{
    size_t l = strlen(file);
    if (!strncmp(msg, file, l) && !strncmp(msg + l, ": ", 2)) {
        return msg + l + 2;
    }
    return msg;
}

/* True if path is the file of one of the sources or of their backing
 * chains. An image being read must not be recreated or written under the
 * reader: qemu-img's locks refuse it ("Failed to get "write" lock"). */
bool cv_is_source_file(bi_node *const *src, int n_src, const char *path);
bool cv_is_source_file(bi_node *const *src, int n_src, const char *path)
{
    struct stat t, s;
    if (stat(path, &t) < 0) {
        return false;
    }
    for (int i = 0; i < n_src; i++) {
        for (bi_node *n = src[i]; n; n = bi_node_backing(n)) {
            bi_node *f = bi_node_file(n) ? bi_node_file(n) : n;
            if (stat(bi_node_filename(f), &s) == 0 && s.st_dev == t.st_dev &&
                s.st_ino == t.st_ino) {
                return true;
            }
        }
    }
    return false;
}

enum {
    OPT_IMAGE_OPTS = 256,
    OPT_TARGET_IMAGE_OPTS,
    OPT_TARGET_IS_ZERO,
    OPT_PROGRESS,
    OPT_FORCE_SHARE,
    OPT_BITMAPS,
    OPT_SKIP_BROKEN,
};

int img_convert(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"image-opts", no_argument, NULL, OPT_IMAGE_OPTS},
        {"target-image-opts", no_argument, NULL, OPT_TARGET_IMAGE_OPTS},
        {"target-is-zero", no_argument, NULL, OPT_TARGET_IS_ZERO},
        {"force-share", no_argument, NULL, 'U'},
        {"progress", optional_argument, NULL, OPT_PROGRESS},
        {"bitmaps", no_argument, NULL, OPT_BITMAPS},
        {"skip-broken-bitmaps", no_argument, NULL, OPT_SKIP_BROKEN},
        {NULL, 0, NULL, 0},
    };
    const char *fmt = NULL, *out_fmt = NULL, *out_baseimg = NULL;
    const char *backing_fmt = NULL;
    const char *cache = "unsafe", *src_cache = "writeback";
    enum bi_cache tcache, scache;
    bool compress = false, copy_range = false, quiet = false;
    bool skip_create = false, out_of_order = false, force_share = false;
    bool image_opts = false, tgt_image_opts = false, target_is_zero = false;
    bool explicit_min_sparse = false;
    bool bitmaps = false, skip_broken = false; /* img_bitmap.c */
    enum bi_progress_mode pmode = BI_PROGRESS_NONE;
    uint64_t min_sparse = 4096, rate_limit = 0;
    int num_co = 8;
    struct bi_optlist opts, sn_opts;
    const char *snapshot_name = NULL;
    bool have_sn_opts = false;
    char **optv = NULL;
    bi_node **src = NULL;
    bi_node *dst = NULL;
    int n_src = 0, ret = 1;
    uint64_t total = 0;
    struct bi_progress prog;
    bool prog_started = false;
    bi_error err;
    int c;

    /* Buffers come and go per cluster (compression state, bounce and
     * compressed-data buffers on worker threads): keep freed memory instead
     * of trimming it back each time (each trim is a TLB shootdown across
     * CPUs). Peak use is bounded by the engine anyway. */
    mallopt(M_TRIM_THRESHOLD, 64 * 1024 * 1024);
    mallopt(M_MMAP_THRESHOLD, 16 * 1024 * 1024);

    memset(&opts, 0, sizeof(opts));
    memset(&sn_opts, 0, sizeof(sn_opts));
    optind = 1;
    opterr = 0;
    for (;;) {
        c = getopt_long(argc, argv,
                        ":hf:O:B:CcF:o:l:S:pt:T:qnm:WUr:", long_opts, NULL);
        if (c == -1) {
            break;
        }
        switch (c) {
        case ':':
        case '?':
            cv_getopt_error(argv, c);
            goto out_noprog;
        case 'h':
            printf("usage: %s convert [--object objectdef] [--image-opts] "
                   "[--target-image-opts] [--target-is-zero] [-U] [-C] "
                   "[-c] [-p] [-q] [-n] [-f fmt] [-t cache] [-T src_cache] "
                   "[-O output_fmt] [-B backing_file [-F backing_fmt]] "
                   "[-o options] [-S sparse_size] [-m num_coroutines] [-W] "
                   "[--progress=qemu|bar|json] filename [filename2 [...]] "
                   "output_filename\n",
                   program_invocation_short_name);
            ret = 0;
            goto out_noprog;
        case 'f':
            fmt = optarg;
            break;
        case 'O':
            out_fmt = optarg;
            break;
        case 'B':
            out_baseimg = optarg;
            break;
        case 'C':
            copy_range = true;
            break;
        case 'c':
            compress = true;
            break;
        case 'F':
            backing_fmt = optarg;
            break;
        case 'o':
            if (bi_optlist_parse(&opts, optarg) < 0) {
                cv_err("Invalid option list: %s", optarg);
                goto out_noprog;
            }
            break;
        case 'l':
            /* "snapshot.id=ID,snapshot.name=NAME", or an id or name */
            bi_optlist_free(&sn_opts);
            snapshot_name = NULL;
            if (!strncmp(optarg, "snapshot.", 9)) {
                bool bad = bi_optlist_parse(&sn_opts, optarg) < 0;
                for (int i = 0; !bad && i < sn_opts.n; i++) {
                    const char *k = sn_opts.v[i].key;
                    if (strcmp(k, "snapshot.id") &&
                        strcmp(k, "snapshot.name")) {
                        cv_err("Invalid parameter '%s'", k);
                        bad = true;
                    } else if (!sn_opts.v[i].value) {
                        cv_err("warning: short-form boolean option '%s' "
                               "deprecated",
                               k);
                        fprintf(stderr, "Please use %s=on instead\n", k);
                    }
                }
                if (bad) {
                    cv_err("Failed in parsing snapshot param '%s'", optarg);
                    goto out_noprog;
                }
                have_sn_opts = true;
            } else {
                snapshot_name = optarg;
            }
            break;
        case 'S': {
            uint64_t v;
            if (bi_parse_size(optarg, &v) < 0 || v % 512 ||
                v > 16ULL * 1024 * 1024) {
                cv_err("Invalid buffer size for sparse output specified. "
                       "Valid sizes are multiples of 512 up to 16777216. "
                       "Select 0 to disable sparse detection (fully "
                       "allocates output).");
                goto out_noprog;
            }
            min_sparse = v;
            explicit_min_sparse = true;
            break;
        }
        case 'p':
            pmode = BI_PROGRESS_QEMU;
            break;
        case OPT_PROGRESS:
            if (!optarg) {
                pmode = BI_PROGRESS_QEMU;
            } else if (bi_progress_parse(optarg, &pmode) < 0) {
                cv_err("Invalid progress mode '%s' (use qemu, bar or json)",
                       optarg);
                goto out_noprog;
            }
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
        case 'n':
            skip_create = true;
            break;
        case 'm': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (!*optarg || *end || v < 1 || v > 16) {
                cv_err("Invalid number of coroutines. Allowed number of "
                       "coroutines is between 1 and 16");
                goto out_noprog;
            }
            num_co = (int)v;
            break;
        }
        case 'W':
            out_of_order = true;
            break;
        case 'r':
            if (cv_parse_rate(optarg, &rate_limit) < 0) {
                goto out_noprog;
            }
            break;
        case 'U':
            force_share = true;
            break;
        case OPT_IMAGE_OPTS:
            image_opts = true;
            break;
        case OPT_TARGET_IMAGE_OPTS:
            tgt_image_opts = true;
            break;
        case OPT_TARGET_IS_ZERO:
            target_is_zero = true;
            break;
        case OPT_BITMAPS:
            bitmaps = true;
            break;
        case OPT_SKIP_BROKEN:
            skip_broken = true;
            break;
        }
    }

    if (!out_fmt && !tgt_image_opts) {
        out_fmt = "raw";
    }
    if (skip_broken && !bitmaps) {
        cv_err("Use of --skip-broken-bitmaps requires --bitmaps");
        goto out_noprog;
    }
    if (quiet) {
        pmode = BI_PROGRESS_NONE;
    }
    if (compress && copy_range) {
        cv_err("Cannot enable copy offloading when -c is used");
        goto out_noprog;
    }
    if (explicit_min_sparse && copy_range) {
        cv_err("Cannot enable copy offloading when -S is used");
        goto out_noprog;
    }
    if (skip_create && opts.n) {
        cv_err("-o has no effect when skipping image creation");
        goto out_noprog;
    }
    if (target_is_zero && !skip_create) {
        cv_err("--target-is-zero requires use of -n flag");
        goto out_noprog;
    }
    if (tgt_image_opts && !skip_create) {
        cv_err("--target-image-opts requires use of -n flag");
        goto out_noprog;
    }
    n_src = argc - optind - 1;
    const char *out_filename = n_src >= 1 ? argv[argc - 1] : NULL;
    for (int i = 0; i < opts.n; i++) {
        if (!opts.v[i].value &&
            (!strcmp(opts.v[i].key, "help") || !strcmp(opts.v[i].key, "?"))) {
            if (!out_fmt) {
                cv_err("Option help requires a format be specified");
                goto out_noprog;
            }
            ret = img_print_create_help(out_filename, out_fmt);
            goto out_noprog;
        }
    }
    if (n_src < 1) {
        cv_err("Must specify image file name");
        goto out_noprog;
    }
    if (bi_cache_parse(src_cache, &scache) < 0) {
        cv_err("Invalid source cache option: %s", src_cache);
        goto out_noprog;
    }

    bi_progress_init(&prog, pmode, 1.0f, "convert");
    prog_started = true;
    bi_progress_print(&prog, 0, 100);

    src = bi_xzalloc(sizeof(*src) * (size_t)n_src);
    for (int i = 0; i < n_src; i++) {
        src[i] = cv_open(argv[optind + i], fmt, image_opts, scache, false,
                         force_share, true);
        if (!src[i]) {
            goto out;
        }
        int64_t len = bi_getlength(src[i]);
        if (len < 0) {
            cv_err("Could not get size of %s: %s", argv[optind + i],
                   strerror((int)-len));
            goto out;
        }
        total += (uint64_t)len;
    }

    if (n_src > 1 && (have_sn_opts || snapshot_name)) {
        cv_err("No support for concatenating multiple snapshot");
        goto out;
    }
    if (have_sn_opts || snapshot_name) {
        bi_error serr;
        int r;
        bi_error_init(&serr);
        if (have_sn_opts) {
            r = bi_snapshot_load_tmp(
                src[0], bi_optlist_get(&sn_opts, "snapshot.id"),
                bi_optlist_get(&sn_opts, "snapshot.name"), &serr);
        } else {
            /* an id first, then a name (bdrv_snapshot_load_tmp_by_id_or_name)
             */
            r = bi_snapshot_load_tmp(src[0], snapshot_name, NULL, &serr);
            if (r == -ENOENT) {
                bi_error_init(&serr);
                r = bi_snapshot_load_tmp(src[0], NULL, snapshot_name, &serr);
            }
        }
        if (r < 0) {
            cv_err("Failed to load snapshot: %s", serr.msg);
            goto out;
        }
    }

    if (out_fmt && bi_format_exists(out_fmt) < 0) {
        cv_err("Unknown file format '%s'", out_fmt);
        goto out;
    }
    if (out_fmt && !skip_create &&
        !(bi_format_caps(out_fmt) & BI_FORMAT_CREATE)) {
        cv_err("Format driver '%s' does not support image creation", out_fmt);
        goto out;
    }

    optv = cv_optlist_strv(&opts);
    const char *prealloc_opt = NULL;
    if (!skip_create) {
        for (int i = 0; i < opts.n; i++) {
            if (!key_known(out_fmt, opts.v[i].key)) {
                cv_err("Invalid parameter '%s'", opts.v[i].key);
                goto out;
            }
        }
        if (out_baseimg && strcmp(out_fmt, "qcow2")) {
            cv_err("Backing file not supported for file format '%s'", out_fmt);
            goto out;
        }
        const char *bf = bi_optlist_get(&opts, "backing_file");
        if (bf) {
            out_baseimg = bf;
        }
        const char *bfmt = bi_optlist_get(&opts, "backing_fmt");
        if (bfmt && !backing_fmt) {
            backing_fmt = bfmt;
        }
        prealloc_opt = bi_optlist_get(&opts, "preallocation");
    }
    bool target_has_backing = out_baseimg != NULL;
    if (n_src > 1 && out_baseimg) {
        cv_err("Having a backing file for the target makes no sense when "
               "concatenating multiple input images");
        goto out;
    }
    if (out_baseimg && !backing_fmt) {
        cv_err("Use of backing file requires explicit backing format");
        goto out;
    }
    if (compress) {
        if (out_fmt && strcmp(out_fmt, "qcow2")) {
            cv_err("Compression not supported for this file format");
            goto out;
        }
        if (prealloc_opt && strcmp(prealloc_opt, "off")) {
            cv_err("Compression and preallocation not supported at the "
                   "same time");
            goto out;
        }
    }

    if (bitmaps) {
        if (n_src > 1) {
            cv_err("Copying bitmaps only possible with single source");
            goto out;
        }
        if (cv_check_bitmaps(src[0], skip_broken) < 0) {
            goto out;
        }
    }

    if (!skip_create) {
        struct bi_create_opts co;
        memset(&co, 0, sizeof(co));
        co.format = out_fmt;
        co.size = total;
        co.size_set = true;
        co.options = (const char *const *)optv;
        co.backing_file = out_baseimg;
        co.backing_fmt = backing_fmt;
        co.quiet = true;
        if (backing_fmt && !out_baseimg) {
            cv_err("%s: error while converting %s: Backing format cannot be "
                   "used without backing file",
                   out_filename, out_fmt);
            goto out;
        }
        /* -o size= is overridden by the sources' size, as in qemu-img */
        for (char **p = optv; *p; p++) {
            if (!strncmp(*p, "size=", 5) || !strcmp(*p, "size")) {
                free(*p);
                *p = bi_xasprintf("size=%" PRIu64, total);
            }
        }
        if (cv_is_source_file(src, n_src, out_filename)) {
            cv_err("%s: error while converting %s: Failed to get \"write\" "
                   "lock\nIs another process using the image [%s]?",
                   out_filename, out_fmt, out_filename);
            goto out;
        }
        bi_error_init(&err);
        if (bi_create(out_filename, &co, &err) < 0) {
            cv_err("%s: error while converting %s: %s", out_filename, out_fmt,
                   strip_file_prefix(err.msg, out_filename));
            goto out;
        }
    }

    if (bi_cache_parse(cache, &tcache) < 0) {
        cv_err("Invalid cache option: %s", cache);
        goto out;
    }
    if (skip_create && !tgt_image_opts &&
        cv_is_source_file(src, n_src, out_filename)) {
        cv_err("Could not open '%s': Failed to get \"write\" lock\nIs another "
               "process using the image [%s]?",
               out_filename, out_filename);
        goto out;
    }
    dst = cv_open(out_filename, out_fmt, tgt_image_opts, tcache, true, false,
                  true);
    if (!dst) {
        goto out;
    }
    if (bitmaps && !bi_bitmap_supported(dst)) {
        cv_err("Format driver '%s' does not support bitmaps",
               bi_node_format(dst));
        goto out;
    }
    if (skip_create) {
        int64_t olen = bi_getlength(dst);
        if (olen < 0) {
            cv_err("unable to get output image length: %s",
                   strerror((int)-olen));
            goto out;
        }
        if ((uint64_t)olen < total) {
            cv_err("output file is smaller than input file");
            goto out;
        }
    }
    if (compress && strcmp(bi_node_format(dst), "qcow2")) {
        cv_err("Compression not supported for this file format");
        goto out;
    }

    struct bi_convert_opts o;
    bi_convert_opts_init(&o);
    o.src = src;
    o.n_src = n_src;
    o.dst = dst;
    o.compress = compress;
    o.min_sparse = min_sparse;
    o.num_coroutines = num_co;
    o.out_of_order = out_of_order;
    o.copy_range = copy_range;
    o.rate_limit = rate_limit;
    o.target_has_backing = target_has_backing;
    if (target_has_backing && bi_node_backing(dst)) {
        o.target_backing_size = bi_getlength(bi_node_backing(dst));
    }
    o.target_is_zero = target_is_zero;
    if (!skip_create && min_sparse && !target_has_backing) {
        struct bi_storage_info si;
        memset(&si, 0, sizeof(si));
        bi_node *f = bi_node_file(dst);
        bool blockdev = f && bi_storage_info(f, &si) == 0 && si.is_block_device;
        o.target_is_zero = !blockdev;
    }
    /* The engine flushes unless the cache mode ignores flushes anyway
     * (bi_close flushes too). */
    o.flush = tcache != BI_CACHE_UNSAFE;
    if (pmode != BI_PROGRESS_NONE) {
        o.progress = bi_progress_convert_cb;
        o.progress_opaque = &prog;
    }
    o.cancel = &cv_cancel;

    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    bi_error_init(&err);
    int r = bi_convert(&o, &err);

    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (r == -ECANCELED) {
        if (prog_started && pmode != BI_PROGRESS_NONE) {
            bi_progress_end(&prog);
            prog_started = false;
        }
        cv_err("Interrupted by %s: '%s' is incomplete (%s)",
               cv_signal == SIGTERM ? "SIGTERM" : "SIGINT", out_filename,
               err.msg);
        goto out;
    }
    if (r < 0) {
        cv_err("%s", err.msg);
        goto out;
    }
    if (bitmaps && cv_copy_bitmaps(src[0], dst, skip_broken) < 0) {
        goto out;
    }
    ret = 0;

out:
    if (dst) {
        bi_error_init(&err);
        if (bi_close(dst, &err) < 0 && ret == 0) {
            cv_err("%s", err.msg[0] ? err.msg : "Could not close target");
            ret = 1;
        }
    }
    for (int i = 0; src && i < n_src; i++) {
        if (src[i]) {
            bi_close(src[i], NULL);
        }
    }
    free(src);
    if (prog_started) {
        if (ret == 0) {
            bi_progress_print(&prog, 100, 0);
        }
        bi_progress_end(&prog);
    }
out_noprog:
    cv_free_strv(optv);
    bi_optlist_free(&opts);
    bi_optlist_free(&sn_opts);
    return ret;
}
