/* SPDX-License-Identifier: MIT */
/*
 * blkimg convert: qemu-img convert compatible front end of the copy engine
 * (bi_convert). Also holds the small helpers the other copy subcommands
 * (compare, measure, resize, dd) share: error reporting in qemu-img's
 * style, -o lists, --image-opts strings, opening images.
 */
#include "blkimg/blkimg.h"
#include "blkimg/convert.h"
#include "blkimg/image_ops.h"
#include "common.h"
#include "img.h"
#include "progress.h"
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
/* A protocol driver other than file (nbd). */
static bool cv_other_protocol(const char *name)
{
    int caps = bi_format_caps(name);
    return caps >= 0 && (caps & BI_FORMAT_PROTOCOL) && strcmp(name, "file");
}

/* Adds item (taken) to the NULL-terminated *v of *n items. */
static void cv_push(char ***v, int *n, char *item)
{
    *v = realloc(*v, sizeof(char *) * (size_t)(*n + 2));
    if (!*v) {
        abort();
    }
    (*v)[(*n)++] = item;
    (*v)[*n] = NULL;
}

/* The detect-zeroes of the image options cv_parse_image_opts read last
 * (set on the node once it is open). */
static enum bi_detect_zeroes cv_detect_zeroes;

int cv_parse_image_opts(const char *s, struct bi_open_opts *o,
                        const char **filename, char ***owned)
{
    cv_detect_zeroes = BI_DETECT_ZEROES_OFF;
    struct bi_optlist l;
    memset(&l, 0, sizeof(l));
    if (bi_optlist_parse(&l, s) < 0) {
        cv_err("Invalid option list: %s", s);
        return -EINVAL;
    }
    char **v = NULL, **drv = NULL, **prot = NULL;
    int nv = 0, nd = 0, np = 0;
    const char *fname = NULL, *fproto = NULL;
    for (int i = 0; i < l.n; i++) {
        const char *k = l.v[i].key, *val = l.v[i].value ? l.v[i].value : "on";
        if (!strcmp(k, "driver")) {
            cv_push(&v, &nv, bi_xstrdup(val));
            o->format = v[nv - 1];
        } else if (!strcmp(k, "file.filename") || !strcmp(k, "filename")) {
            cv_push(&v, &nv, bi_xstrdup(val));
            fname = v[nv - 1];
        } else if (!strcmp(k, "file.driver")) {
            int caps = bi_format_caps(val);
            /* a format as the file: raw with offset and size (an OVA) */
            if (cv_other_protocol(val) ||
                (caps >= 0 && (caps & BI_FORMAT_OPEN) &&
                 !(caps & BI_FORMAT_PROTOCOL))) {
                cv_push(&v, &nv, bi_xstrdup(val));
                fproto = v[nv - 1];
            } else if (strcmp(val, "file")) {
                cv_err("Unknown protocol '%s'", val);
                goto fail;
            } else {
                fproto = "file"; /* named: regular files only */
            }
        } else if (!strcmp(k, "backing") && tool_backing_none(val)) {
            o->no_backing = true;
        } else if (!strcmp(k, "discard")) {
            /* convert discards nothing */
            if (strcmp(val, "ignore") && strcmp(val, "off") &&
                strcmp(val, "unmap") && strcmp(val, "on")) {
                cv_err("Could not open '%s': Invalid discard option", s);
                goto fail;
            }
        } else if (!strcmp(k, "detect-zeroes")) {
            if (bi_detect_zeroes_parse(val, &cv_detect_zeroes) < 0) {
                cv_err("Could not open '%s': invalid parameter value: %s", s,
                       val);
                goto fail;
            }
        } else if (!strcmp(k, "file.locking") &&
                   (!strcmp(val, "auto") || !strcmp(val, "on"))) {
            /* the default */
        } else if (!strcmp(k, "file.locking") && !strcmp(val, "off")) {
            o->no_lock = true;
        } else if (!strcmp(k, "cache.direct") || !strcmp(k, "file.aio") ||
                   !strcmp(k, "aio")) {
            /* cache mode comes from -t/-T; aio from the engine */
        } else if (!strncmp(k, "file.", 5)) {
            cv_push(&prot, &np, bi_xasprintf("%s=%s", k + 5, val));
        } else {
            cv_push(&drv, &nd, bi_xasprintf("%s=%s", k, val));
        }
    }
    if (o->format && cv_other_protocol(o->format)) {
        /* driver=nbd: the keys are the protocol's */
        for (int i = 0; i < nd; i++) {
            cv_push(&prot, &np, drv[i]);
        }
        free(drv);
        drv = NULL;
        nd = 0;
    } else if (fproto && strcmp(fproto, "file")) {
        cv_push(&prot, &np, bi_xasprintf("driver=%s", fproto));
    } else if (np) {
        const char *eq = strchr(prot[0], '=');
        cv_err("Could not open '%s': Block protocol 'file' doesn't support "
               "the option '%.*s'",
               s, (int)(eq - prot[0]), prot[0]);
        goto fail;
    }
    if (fproto && !strcmp(fproto, "file")) {
        cv_push(&prot, &np, bi_xstrdup("driver=file"));
    }
    if (!fname && !np) {
        cv_err("Could not open '%s': A block device must be specified for "
               "\"file\"",
               s);
        goto fail;
    }
    *filename = fname;
    o->driver_opts = (const char *const *)drv;
    o->protocol_opts = (const char *const *)prot;
    /* owned: the strings, then the two arrays (freed as strings too) */
    for (int i = 0; i < nd; i++) {
        cv_push(&v, &nv, drv[i]);
    }
    for (int i = 0; i < np; i++) {
        cv_push(&v, &nv, prot[i]);
    }
    if (drv) {
        cv_push(&v, &nv, (char *)drv);
    }
    if (prot) {
        cv_push(&v, &nv, (char *)prot);
    }
    if (!v) {
        v = bi_xzalloc(sizeof(char *));
    }
    *owned = v;
    bi_optlist_free(&l);
    return 0;
fail:
    cv_free_strv(drv);
    cv_free_strv(prot);
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

    char *json = NULL, msg[1024] = "";

    if (!image_opts &&
        tool_json_filename(filename, &json, msg, sizeof(msg)) < 0) {
        cv_err("Could not open '%s': %s", filename, msg);
        return NULL;
    }
    o->format = fmt;
    o->named_by_options = image_opts || json;
    if (image_opts && fmt) {
        cv_err("--image-opts and --format are mutually exclusive");
        return NULL;
    }
    if (image_opts || json) {
        int ret =
            cv_parse_image_opts(json ? json : filename, o, &fname, &owned);
        free(json);
        if (ret < 0) {
            return NULL;
        }
    }
    bi_error_init(&err);
    n = bi_open(fname, o, &err);
    if (!n && o->named_by_options) {
        /* qemu-img names the image by its options */
        cv_err("Could not open '%s': %s", filename,
               tool_open_cause(err.msg, fname));
    } else if (!n) {
        /* the library's message is qemu's whole line */
        cv_err("%s", err.msg);
    }
    if (n && (image_opts || o->named_by_options)) {
        bi_node_set_detect_zeroes(n, cv_detect_zeroes);
    }
    /* the format's own keys: unknown or refused ones fail, as in QEMU */
    for (const char *const *p = o->driver_opts; n && p && *p; p++) {
        if (tool_check_driver_opt(bi_node_format(n), *p, msg, sizeof(msg)) <
            0) {
            cv_err("Could not open '%s': %s", filename, msg);
            bi_close(n, NULL);
            n = NULL;
        }
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
    OPT_OBJECT,
};

/* What convert's command line asked for. */
struct cv_args {
    const char *fmt, *out_fmt, *out_baseimg, *backing_fmt;
    const char *cache, *src_cache;
    bool compress, copy_range, quiet, skip_create, out_of_order;
    bool force_share, image_opts, tgt_image_opts, target_is_zero;
    bool explicit_min_sparse;
    bool bitmaps, skip_broken; /* img_bitmap.c */
    enum bi_progress_mode pmode;
    uint64_t min_sparse, rate_limit;
    int num_co;
    struct bi_optlist opts;    /* -o */
    struct bi_optlist sn_opts; /* -l snapshot.id=...,snapshot.name=... */
    const char *snapshot_name; /* -l ID_OR_NAME */
    bool have_sn_opts;
    char **src_names; /* n_src of them */
    int n_src;
    const char *out_filename;
};

/* One conversion: the images and what the checks found. */
struct cv_run {
    struct cv_args *a;
    bi_node **src; /* a->n_src, NULL until opened */
    bi_node *dst;
    uint64_t total; /* bytes of all sources */
    char **optv;    /* -o as "key=value" strings */
    const char *prealloc_opt;
    enum bi_cache tcache, scache;
    struct bi_progress prog;
    bool prog_started;
};

/* -l: "snapshot.id=ID,snapshot.name=NAME" (either or both), or an id or
 * name. 0, or -1 with qemu-img's message printed. */
static int parse_snapshot_arg(struct cv_args *a, const char *arg)
{
    bi_optlist_free(&a->sn_opts);
    a->snapshot_name = NULL;
    a->have_sn_opts = false;
    if (strncmp(arg, "snapshot.", 9)) {
        a->snapshot_name = arg;
        return 0;
    }
    bool bad = bi_optlist_parse(&a->sn_opts, arg) < 0;
    for (int i = 0; !bad && i < a->sn_opts.n; i++) {
        const char *k = a->sn_opts.v[i].key;
        if (strcmp(k, "snapshot.id") && strcmp(k, "snapshot.name")) {
            cv_err("Invalid parameter '%s'", k);
            bad = true;
        } else if (!a->sn_opts.v[i].value) {
            cv_err("warning: short-form boolean option '%s' deprecated", k);
            fprintf(stderr, "Please use %s=on instead\n", k);
        }
    }
    if (bad) {
        cv_err("Failed in parsing snapshot param '%s'", arg);
        return -1;
    }
    a->have_sn_opts = true;
    return 0;
}

/* The numeric options: -S, -m, -r. 0, or -1 with the message printed. */
static int parse_number_arg(struct cv_args *a, int c, const char *arg)
{
    if (c == 'S') {
        uint64_t v;
        if (bi_parse_size(arg, &v) < 0 || v % 512 || v > 16ULL * 1024 * 1024) {
            cv_err("Invalid buffer size for sparse output specified. "
                   "Valid sizes are multiples of 512 up to 16777216. "
                   "Select 0 to disable sparse detection (fully "
                   "allocates output).");
            return -1;
        }
        a->min_sparse = v;
        a->explicit_min_sparse = true;
    } else if (c == 'm') {
        char *end;
        long v = strtol(arg, &end, 10);
        if (!*arg || *end || v < 1 || v > 16) {
            cv_err("Invalid number of coroutines. Allowed number of "
                   "coroutines is between 1 and 16");
            return -1;
        }
        a->num_co = (int)v;
    } else if (cv_parse_rate(arg, &a->rate_limit) < 0) {
        return -1;
    }
    return 0;
}

/* One option of getopt_long's return c. 0, 1 after --help, -1 on error
 * (message printed). */
static int parse_option(struct cv_args *a, int c, char **argv)
{
    switch (c) {
    case ':':
    case '?':
        cv_getopt_error(argv, c);
        return -1;
    case 'h':
        printf("usage: %s convert [--object objectdef] [--image-opts] "
               "[--target-image-opts] [--target-is-zero] [-U] [-C] "
               "[-c] [-p] [-q] [-n] [-f fmt] [-t cache] [-T src_cache] "
               "[-O output_fmt] [-B backing_file [-F backing_fmt]] "
               "[-o options] [-S sparse_size] [-m num_coroutines] [-W] "
               "[--progress=qemu|bar|json] filename [filename2 [...]] "
               "output_filename\n",
               program_invocation_short_name);
        return 1;
    case 'f':
        a->fmt = optarg;
        break;
    case 'O':
        a->out_fmt = optarg;
        break;
    case 'B':
        a->out_baseimg = optarg;
        break;
    case 'C':
        a->copy_range = true;
        break;
    case 'c':
        a->compress = true;
        break;
    case 'F':
        a->backing_fmt = optarg;
        break;
    case 'o':
        if (bi_optlist_parse(&a->opts, optarg) < 0) {
            cv_err("Invalid option list: %s", optarg);
            return -1;
        }
        break;
    case 'l':
        return parse_snapshot_arg(a, optarg);
    case 'S':
    case 'm':
    case 'r':
        return parse_number_arg(a, c, optarg);
    case 'p':
        a->pmode = BI_PROGRESS_QEMU;
        break;
    case OPT_PROGRESS:
        if (!optarg) {
            a->pmode = BI_PROGRESS_QEMU;
        } else if (bi_progress_parse(optarg, &a->pmode) < 0) {
            cv_err("Invalid progress mode '%s' (use qemu, bar or json)",
                   optarg);
            return -1;
        }
        break;
    case 't':
        a->cache = optarg;
        break;
    case 'T':
        a->src_cache = optarg;
        break;
    case 'q':
        a->quiet = true;
        break;
    case 'n':
        a->skip_create = true;
        break;
    case 'W':
        a->out_of_order = true;
        break;
    case 'U':
        a->force_share = true;
        break;
    case OPT_OBJECT:
        return tool_object_add(optarg);
    case OPT_IMAGE_OPTS:
        a->image_opts = true;
        break;
    case OPT_TARGET_IMAGE_OPTS:
        a->tgt_image_opts = true;
        break;
    case OPT_TARGET_IS_ZERO:
        a->target_is_zero = true;
        break;
    case OPT_BITMAPS:
        a->bitmaps = true;
        break;
    case OPT_SKIP_BROKEN:
        a->skip_broken = true;
        break;
    }
    return 0;
}

/* The combinations qemu-img refuses before opening anything. 0 or -1. */
static int check_args(struct cv_args *a)
{
    if (a->skip_broken && !a->bitmaps) {
        cv_err("Use of --skip-broken-bitmaps requires --bitmaps");
    } else if (a->compress && a->copy_range) {
        cv_err("Cannot enable copy offloading when -c is used");
    } else if (a->explicit_min_sparse && a->copy_range) {
        cv_err("Cannot enable copy offloading when -S is used");
    } else if (a->skip_create && a->opts.n) {
        cv_err("-o has no effect when skipping image creation");
    } else if (a->target_is_zero && !a->skip_create) {
        cv_err("--target-is-zero requires use of -n flag");
    } else if (a->tgt_image_opts && !a->skip_create) {
        cv_err("--target-image-opts requires use of -n flag");
    } else {
        return 0;
    }
    return -1;
}

/* Parses convert's command line into a (initialised here). Returns -1 to
 * go on, else the exit status (errors printed, or -h / -o help done). */
static int parse_args(int argc, char **argv, struct cv_args *a)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"image-opts", no_argument, NULL, OPT_IMAGE_OPTS},
        {"object", required_argument, NULL, OPT_OBJECT},
        {"target-image-opts", no_argument, NULL, OPT_TARGET_IMAGE_OPTS},
        {"target-is-zero", no_argument, NULL, OPT_TARGET_IS_ZERO},
        {"force-share", no_argument, NULL, 'U'},
        {"progress", optional_argument, NULL, OPT_PROGRESS},
        {"bitmaps", no_argument, NULL, OPT_BITMAPS},
        {"skip-broken-bitmaps", no_argument, NULL, OPT_SKIP_BROKEN},
        {NULL, 0, NULL, 0},
    };
    int c, r;

    memset(a, 0, sizeof(*a));
    a->cache = "unsafe";
    a->src_cache = "writeback";
    a->min_sparse = 4096;
    a->num_co = 8;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hf:O:B:CcF:o:l:S:pt:T:qnm:WUr:",
                            long_opts, NULL)) != -1) {
        if ((r = parse_option(a, c, argv)) != 0) {
            return r > 0 ? 0 : 1;
        }
    }
    if (!a->out_fmt && !a->tgt_image_opts) {
        a->out_fmt = IMG_DEFAULT_FORMAT;
    }
    if (a->quiet) {
        a->pmode = BI_PROGRESS_NONE;
    }
    if (check_args(a) < 0) {
        return 1;
    }
    a->n_src = argc - optind - 1;
    a->src_names = argv + optind;
    a->out_filename = a->n_src >= 1 ? argv[argc - 1] : NULL;
    for (int i = 0; i < a->opts.n; i++) {
        if (!a->opts.v[i].value && (!strcmp(a->opts.v[i].key, "help") ||
                                    !strcmp(a->opts.v[i].key, "?"))) {
            if (!a->out_fmt) {
                cv_err("Option help requires a format be specified");
                return 1;
            }
            return img_print_create_help(a->out_filename, a->out_fmt);
        }
    }
    if (a->n_src < 1) {
        cv_err("Must specify image file name");
        return 1;
    }
    return -1;
}

/* Opens every source (r->src, r->total). 0 or -1 (message printed). */
static int open_sources(struct cv_run *r)
{
    const struct cv_args *a = r->a;
    r->src = bi_xzalloc(sizeof(*r->src) * (size_t)a->n_src);
    for (int i = 0; i < a->n_src; i++) {
        r->src[i] = cv_open(a->src_names[i], a->fmt, a->image_opts, r->scache,
                            false, a->force_share, true);
        if (!r->src[i]) {
            return -1;
        }
        int64_t len = bi_getlength(r->src[i]);
        if (len < 0) {
            cv_err("Could not get size of %s: %s", a->src_names[i],
                   strerror((int)-len));
            return -1;
        }
        r->total += (uint64_t)len;
    }
    return 0;
}

/* -l: the single source reads the snapshot. 0 or -1 (message printed). */
static int load_snapshot(struct cv_run *r)
{
    const struct cv_args *a = r->a;
    bi_error serr;
    int ret;

    if (!a->have_sn_opts && !a->snapshot_name) {
        return 0;
    }
    if (a->n_src > 1) {
        cv_err("No support for concatenating multiple snapshot");
        return -1;
    }
    bi_error_init(&serr);
    if (a->have_sn_opts) {
        ret = bi_snapshot_load_tmp(
            r->src[0], bi_optlist_get(&a->sn_opts, "snapshot.id"),
            bi_optlist_get(&a->sn_opts, "snapshot.name"), &serr);
    } else {
        /* an id first, then a name (bdrv_snapshot_load_tmp_by_id_or_name) */
        ret = bi_snapshot_load_tmp(r->src[0], a->snapshot_name, NULL, &serr);
        if (ret == -ENOENT) {
            bi_error_init(&serr);
            ret =
                bi_snapshot_load_tmp(r->src[0], NULL, a->snapshot_name, &serr);
        }
    }
    if (ret < 0) {
        cv_err("Failed to load snapshot: %s", serr.msg);
        return -1;
    }
    return 0;
}

/* What the target's format must offer for -o, -B, -c and --bitmaps, as
 * qemu-img checks it before creating anything. 0 or -1. */
static int check_target(struct cv_run *r)
{
    struct cv_args *a = r->a;
    if (a->out_fmt && bi_format_exists(a->out_fmt) < 0) {
        cv_err("Unknown file format '%s'", a->out_fmt);
        return -1;
    }
    if (a->out_fmt && !a->skip_create &&
        !(bi_format_caps(a->out_fmt) & BI_FORMAT_CREATE)) {
        cv_err("Format driver '%s' does not support image creation",
               a->out_fmt);
        return -1;
    }
    r->optv = cv_optlist_strv(&a->opts);
    if (!a->skip_create) {
        for (int i = 0; i < a->opts.n; i++) {
            const char *k = a->opts.v[i].key;
            if (a->out_filename
                    ? !bi_create_opt_find_at(a->out_fmt, a->out_filename, k)
                    : !bi_create_opt_find(a->out_fmt, k)) {
                cv_err("Invalid parameter '%s'", a->opts.v[i].key);
                return -1;
            }
        }
        if (a->out_baseimg &&
            !(bi_format_caps(a->out_fmt) & BI_FORMAT_BACKING)) {
            cv_err("Backing file not supported for file format '%s'",
                   a->out_fmt);
            return -1;
        }
        const char *bf = bi_optlist_get(&a->opts, "backing_file");
        if (bf) {
            a->out_baseimg = bf;
        }
        const char *bfmt = bi_optlist_get(&a->opts, "backing_fmt");
        if (bfmt && !a->backing_fmt) {
            a->backing_fmt = bfmt;
        }
        r->prealloc_opt = bi_optlist_get(&a->opts, "preallocation");
    }
    if (a->n_src > 1 && a->out_baseimg) {
        cv_err("Having a backing file for the target makes no sense when "
               "concatenating multiple input images");
        return -1;
    }
    if (a->out_baseimg && !a->backing_fmt) {
        cv_err("Use of backing file requires explicit backing format");
        return -1;
    }
    if (a->compress && a->out_fmt &&
        !(bi_format_caps(a->out_fmt) & BI_FORMAT_COMPRESS)) {
        cv_err("Compression not supported for this file format");
        return -1;
    }
    if (a->compress && r->prealloc_opt && strcmp(r->prealloc_opt, "off")) {
        cv_err("Compression and preallocation not supported at the "
               "same time");
        return -1;
    }
    const char *enc = bi_optlist_get(&a->opts, "encryption");
    if (a->compress && ((enc && strcmp(enc, "off")) ||
                        bi_optlist_get(&a->opts, "encrypt.format"))) {
        cv_err("Compression and encryption not supported at the same time");
        return -1;
    }
    if (a->bitmaps && a->n_src > 1) {
        cv_err("Copying bitmaps only possible with single source");
        return -1;
    }
    return a->bitmaps && cv_check_bitmaps(r->src[0], a->skip_broken) < 0 ? -1
                                                                         : 0;
}

/* Creates the target (unless -n) with the sources' total size. 0 or -1. */
static int create_target(struct cv_run *r)
{
    const struct cv_args *a = r->a;
    struct bi_create_opts co;
    bi_error err;

    bi_create_opts_init(&co);
    co.format = a->out_fmt;
    co.size = r->total;
    co.size_set = true;
    co.options = (const char *const *)r->optv;
    co.backing_file = a->out_baseimg;
    co.backing_fmt = a->backing_fmt;
    if (a->backing_fmt && !a->out_baseimg) {
        cv_err("%s: error while converting %s: Backing format cannot be "
               "used without backing file",
               a->out_filename, a->out_fmt);
        return -1;
    }
    /* -o size= is overridden by the sources' size, as in qemu-img */
    for (char **p = r->optv; *p; p++) {
        if (!strncmp(*p, "size=", 5) || !strcmp(*p, "size")) {
            free(*p);
            *p = bi_xasprintf("size=%" PRIu64, r->total);
        }
    }
    if (cv_is_source_file(r->src, a->n_src, a->out_filename)) {
        cv_err("%s: error while converting %s: Failed to get \"write\" "
               "lock\nIs another process using the image [%s]?",
               a->out_filename, a->out_fmt, a->out_filename);
        return -1;
    }
    bi_error_init(&err);
    if (bi_create(a->out_filename, &co, &err) < 0) {
        cv_err("%s: error while converting %s: %s", a->out_filename, a->out_fmt,
               strip_file_prefix(err.msg, a->out_filename));
        return -1;
    }
    return 0;
}

/* Opens the target read-write (r->dst) and checks it can take the copy.
 * 0 or -1 (message printed). */
static int open_target(struct cv_run *r)
{
    const struct cv_args *a = r->a;
    if (bi_cache_parse(a->cache, &r->tcache) < 0) {
        cv_err("Invalid cache option: %s", a->cache);
        return -1;
    }
    if (a->skip_create && !a->tgt_image_opts &&
        cv_is_source_file(r->src, a->n_src, a->out_filename)) {
        cv_err("Could not open '%s': Failed to get \"write\" lock\nIs another "
               "process using the image [%s]?",
               a->out_filename, a->out_filename);
        return -1;
    }
    /* as qemu-img: the creation options naming key secrets open it too */
    char **keys = bi_xzalloc(sizeof(*keys) * (size_t)(a->opts.n + 1));
    for (int i = 0, k = 0; i < a->opts.n; i++) {
        const char *key = a->opts.v[i].key;
        size_t kl = strlen(key);
        if (kl >= 10 && !strcmp(key + kl - 10, "key-secret"))
            keys[k++] = bi_xasprintf(
                "%s=%s", key, a->opts.v[i].value ? a->opts.v[i].value : "");
    }
    struct bi_open_opts o;
    bi_open_opts_init(&o);
    o.cache = r->tcache;
    o.backing_cache = r->tcache;
    o.read_write = true;
    o.quiet_probe = true;
    o.driver_opts = (const char *const *)keys;
    r->dst = cv_open_opts(a->out_filename, a->out_fmt, a->tgt_image_opts, &o);
    for (char **p = keys; *p; p++)
        free(*p);
    free(keys);
    if (!r->dst) {
        return -1;
    }
    const char *dfmt = bi_node_format(r->dst);
    if (a->bitmaps && !bi_bitmap_supported(r->dst)) {
        cv_err("Format driver '%s' does not support bitmaps", dfmt);
        return -1;
    }
    if (a->skip_create) {
        int64_t olen = bi_getlength(r->dst);
        if (olen < 0) {
            cv_err("unable to get output image length: %s",
                   strerror((int)-olen));
            return -1;
        }
        if ((uint64_t)olen < r->total) {
            cv_err("output file is smaller than input file");
            return -1;
        }
    }
    if (a->compress && !(bi_format_caps(dfmt) & BI_FORMAT_COMPRESS)) {
        cv_err("Compression not supported for this file format");
        return -1;
    }
    return 0;
}

/* The copy engine's options for this run. */
static void copy_options(struct cv_run *r, struct bi_convert_opts *o)
{
    const struct cv_args *a = r->a;
    bool target_has_backing = a->out_baseimg != NULL;

    bi_convert_opts_init(o);
    o->src = r->src;
    o->n_src = a->n_src;
    o->dst = r->dst;
    o->compress = a->compress;
    o->min_sparse = a->min_sparse;
    o->num_coroutines = a->num_co;
    o->out_of_order = a->out_of_order;
    o->copy_range = a->copy_range;
    o->rate_limit = a->rate_limit;
    o->target_has_backing = target_has_backing;
    if (target_has_backing && bi_node_backing(r->dst)) {
        o->target_backing_size = bi_getlength(bi_node_backing(r->dst));
    }
    o->target_is_zero = a->target_is_zero;
    if (!a->skip_create && a->min_sparse && !target_has_backing) {
        struct bi_storage_info si;
        memset(&si, 0, sizeof(si));
        bi_node *f = bi_node_file(r->dst);
        bool blockdev = f && bi_storage_info(f, &si) == 0 && si.is_block_device;
        /* an encrypted image's unwritten data is noise, not zeroes */
        o->target_is_zero =
            !blockdev &&
            !(bi_format_caps(bi_node_format(r->dst)) & BI_FORMAT_NO_ZERO_INIT);
    }
    /* The engine flushes unless the cache mode ignores flushes anyway
     * (bi_close flushes too). */
    o->flush = r->tcache != BI_CACHE_UNSAFE;
    if (a->pmode != BI_PROGRESS_NONE) {
        o->progress = bi_progress_convert_cb;
        o->progress_opaque = &r->prog;
    }
    o->cancel = &cv_cancel;
}

/* Runs the copy (SIGINT and SIGTERM stop it cleanly), then --bitmaps. 0
 * or -1 (message printed). */
static int run_copy(struct cv_run *r)
{
    const struct cv_args *a = r->a;
    struct bi_convert_opts o;
    struct sigaction sa, old_int, old_term;
    bi_error err;

    copy_options(r, &o);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    bi_error_init(&err);
    int ret = bi_convert(&o, &err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (ret == -ECANCELED) {
        if (r->prog_started && a->pmode != BI_PROGRESS_NONE) {
            bi_progress_end(&r->prog);
            r->prog_started = false;
        }
        cv_err("Interrupted by %s: '%s' is incomplete (%s)",
               cv_signal == SIGTERM ? "SIGTERM" : "SIGINT", a->out_filename,
               err.msg);
        return -1;
    }
    if (ret < 0) {
        cv_err("%s", err.msg);
        return -1;
    }
    if (a->bitmaps && cv_copy_bitmaps(r->src[0], r->dst, a->skip_broken) < 0) {
        return -1;
    }
    return 0;
}

/* The phases after the command line: sources, target checks, creation,
 * target, copy. 0 or -1 (message printed). */
static int convert_images(struct cv_run *r)
{
    if (open_sources(r) < 0 || load_snapshot(r) < 0 || check_target(r) < 0) {
        return -1;
    }
    if (!r->a->skip_create && create_target(r) < 0) {
        return -1;
    }
    return open_target(r) < 0 || run_copy(r) < 0 ? -1 : 0;
}

/* Closes the target (its close error counts when all else went well) and
 * the sources, ends the progress output; returns the exit status. */
static int finish(struct cv_run *r, int ret)
{
    bi_error err;
    if (r->dst) {
        bi_error_init(&err);
        if (bi_close(r->dst, &err) < 0 && ret == 0) {
            cv_err("%s", err.msg[0] ? err.msg : "Could not close target");
            ret = 1;
        }
    }
    for (int i = 0; r->src && i < r->a->n_src; i++) {
        if (r->src[i]) {
            bi_close(r->src[i], NULL);
        }
    }
    free(r->src);
    if (r->prog_started) {
        if (ret == 0) {
            bi_progress_print(&r->prog, 100, 0);
        }
        bi_progress_end(&r->prog);
    }
    return ret;
}

int img_convert(int argc, char **argv)
{
    struct cv_args a;
    struct cv_run r;
    int ret;

    /* Buffers come and go per cluster (compression state, bounce and
     * compressed-data buffers on worker threads): keep freed memory instead
     * of trimming it back each time (each trim is a TLB shootdown across
     * CPUs). Peak use is bounded by the engine anyway. */
    mallopt(M_TRIM_THRESHOLD, 64 * 1024 * 1024);
    mallopt(M_MMAP_THRESHOLD, 16 * 1024 * 1024);

    memset(&r, 0, sizeof(r));
    r.a = &a;
    ret = parse_args(argc, argv, &a);
    if (ret < 0) {
        if (bi_cache_parse(a.src_cache, &r.scache) < 0) {
            cv_err("Invalid source cache option: %s", a.src_cache);
            ret = 1;
        } else {
            bi_progress_init(&r.prog, a.pmode, 1.0f, "convert");
            r.prog_started = true;
            bi_progress_print(&r.prog, 0, 100);
            ret = finish(&r, convert_images(&r) < 0 ? 1 : 0);
        }
    }
    cv_free_strv(r.optv);
    bi_optlist_free(&a.opts);
    bi_optlist_free(&a.sn_opts);
    return ret;
}
