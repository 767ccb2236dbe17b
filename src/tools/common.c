/* SPDX-License-Identifier: MIT */
/* Shared tool plumbing; see common.h. */
#include "common.h"
#include "util/util.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ messages */

const char *tool_prog = "blkimg";

void tool_init(const char *argv0)
{
    if (argv0 && *argv0) {
        const char *p = strrchr(argv0, '/');
        tool_prog = p ? p + 1 : argv0;
    }
}

/* stdout is not flushed first: qemu-img's messages do not either, which
 * decides the order of the two streams when they share a pipe. */
static void verror(const char *fmt, va_list ap)
{
    fprintf(stderr, "%s: ", tool_prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void tool_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verror(fmt, ap);
    va_end(ap);
}

void tool_error_exit(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verror(fmt, ap);
    va_end(ap);
    fprintf(stderr, "Try '%s --help' for more information\n", tool_prog);
    exit(EXIT_FAILURE);
}

void tool_getopt_error(int c, char **argv)
{
    if (c == ':') {
        tool_error_exit("missing argument for option '%s'", argv[optind - 1]);
    }
    tool_error_exit("unrecognized option '%s'", argv[optind - 1]);
}

void tool_report(const bi_error *err)
{
    tool_error("%s", err->msg[0] ? err->msg : strerror(-err->code));
}

/* ------------------------------------------------------------- numbers */

int64_t tool_cvtnum_full(const char *name, const char *value, int64_t min,
                         int64_t max)
{
    uint64_t res = 0;
    bool hex_suffix = false;
    int err = bi_parse_size_full(value, &res, &hex_suffix);

    if (err < 0 && err != -ERANGE) {
        tool_error("Invalid %s specified. You may use "
                   "k, M, G, T, P or E suffixes for",
                   name);
        tool_error("kilobytes, megabytes, gigabytes, terabytes, "
                   "petabytes and exabytes.");
        return err;
    }
    if (hex_suffix) {
        tool_error("warning: Using a multiplier suffix on hex numbers is "
                   "deprecated: %s",
                   value);
    }
    if (err == -ERANGE || res > (uint64_t)max || (int64_t)res < min) {
        tool_error("Invalid %s specified. Must be between %" PRId64
                   " and %" PRId64 ".",
                   name, min, max);
        return -ERANGE;
    }
    return (int64_t)res;
}

int64_t tool_cvtnum(const char *name, const char *value)
{
    return tool_cvtnum_full(name, value, 0, INT64_MAX);
}

int tool_strtoul(const char *s, unsigned long *res)
{
    char *end;
    unsigned long v;

    if (!s) {
        return -EINVAL;
    }
    errno = 0;
    v = strtoul(s, &end, 0);
    if (errno == ERANGE) {
        return -ERANGE;
    }
    if (end == s || *end) {
        return -EINVAL;
    }
    *res = v;
    return 0;
}

/* --------------------------------------------------------------- output */

int tool_parse_output(const char *s, enum tool_output *out)
{
    if (!s || !strcmp(s, "human")) {
        *out = TOOL_OUTPUT_HUMAN;
    } else if (!strcmp(s, "json")) {
        *out = TOOL_OUTPUT_JSON;
    } else {
        tool_error("--output must be used with human or json as argument.");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------- opening images */

void tool_image_init(struct tool_image *ti)
{
    memset(ti, 0, sizeof(*ti));
    ti->cache = BI_CACHE_WRITEBACK;
}

void tool_image_opts_free(struct tool_image_opts *io)
{
    free(io->driver);
    free(io->filename);
    if (io->driver_opts) {
        for (int i = 0; i < io->n_driver_opts; i++) {
            free(io->driver_opts[i]);
        }
        free(io->driver_opts);
    }
    memset(io, 0, sizeof(*io));
}

/* QEMU's boolean option values. */
static int parse_bool(const char *v, bool *out)
{
    if (!strcmp(v, "on") || !strcmp(v, "yes") || !strcmp(v, "true") ||
        !strcmp(v, "y")) {
        *out = true;
    } else if (!strcmp(v, "off") || !strcmp(v, "no") || !strcmp(v, "false") ||
               !strcmp(v, "n")) {
        *out = false;
    } else {
        return -EINVAL;
    }
    return 0;
}

/* Splits "k=v,k2=v2" as QemuOpts does: ",," is a literal comma; the first
 * element may lack "=": it is then the value of the implied key "file". */
int tool_parse_image_opts(const char *s, struct tool_image_opts *io,
                          char *errbuf, size_t errlen)
{
    const char *p = s;
    bool first = true;
    bool file_is_ref = false, file_given = false;
    char *file_ref = NULL, *plain_filename = NULL;

    memset(io, 0, sizeof(*io));
    io->driver_opts = bi_xzalloc(sizeof(char *));
    while (*p) {
        /* key: up to '=' or ',' */
        const char *k = p;
        size_t klen = strcspn(p, "=,");
        char *key, *val;

        if (p[klen] == '=') {
            key = bi_xasprintf("%.*s", (int)klen, k);
            p += klen + 1;
        } else if (first) {
            key = bi_xstrdup("file");
        } else {
            /* "key" alone: a flag ("key" = on, "nokey" = off) */
            key = bi_xasprintf("%.*s", (int)klen, k);
            p += klen;
            val = NULL;
            if (!strncmp(key, "no", 2)) {
                char *rest = bi_xstrdup(key + 2);
                free(key);
                key = rest;
                val = bi_xstrdup("off");
            } else {
                val = bi_xstrdup("on");
            }
            if (*p == ',') {
                p++;
            }
            goto have_pair;
        }
        /* value: up to a single ',' (",," is a literal comma) */
        {
            size_t cap = strlen(p) + 1, n = 0;
            val = bi_xmalloc(cap);
            while (*p) {
                if (*p == ',') {
                    if (p[1] == ',') {
                        val[n++] = ',';
                        p += 2;
                        continue;
                    }
                    p++;
                    break;
                }
                val[n++] = *p++;
            }
            val[n] = 0;
        }
    have_pair:
        first = false;
        if (!key[0]) {
            snprintf(errbuf, errlen, "Invalid parameter ''");
            free(key);
            free(val);
            goto fail;
        }
        int bad = 0;
        if (!strcmp(key, "driver")) {
            free(io->driver);
            io->driver = val;
            val = NULL;
        } else if (!strcmp(key, "file.filename")) {
            free(io->filename);
            io->filename = val;
            val = NULL;
            file_given = true;
        } else if (!strcmp(key, "filename")) {
            free(plain_filename);
            plain_filename = val;
            val = NULL;
        } else if (!strcmp(key, "file")) {
            free(file_ref);
            file_ref = val;
            val = NULL;
            file_is_ref = true;
            file_given = true;
        } else if (!strcmp(key, "file.driver")) {
            file_given = true;
            if (strcmp(val, "file")) {
                snprintf(errbuf, errlen, "Unknown driver '%s'", val);
                bad = 1;
            }
        } else if (!strcmp(key, "cache.direct") ||
                   !strcmp(key, "file.cache.direct")) {
            io->has_direct = true;
            bad = parse_bool(val, &io->direct);
        } else if (!strcmp(key, "cache.no-flush") ||
                   !strcmp(key, "file.cache.no-flush")) {
            io->has_no_flush = true;
            bad = parse_bool(val, &io->no_flush);
        } else if (!strcmp(key, "force-share")) {
            io->has_force_share = true;
            bad = parse_bool(val, &io->force_share);
        } else if (!strcmp(key, "read-only")) {
            io->has_read_only = true;
            bad = parse_bool(val, &io->read_only);
        } else if (!strcmp(key, "locking") || !strcmp(key, "file.locking")) {
            /* "auto" behaves as "on" for local files */
            io->has_locking = true;
            io->locking = true;
            if (strcmp(val, "auto")) {
                bad = parse_bool(val, &io->locking);
            }
        } else if (!strcmp(key, "aio") || !strcmp(key, "file.aio")) {
            io->has_aio = true;
            if (bi_aio_parse(val, &io->aio) < 0) {
                snprintf(errbuf, errlen,
                         "Parameter 'aio' does not accept value '%s'", val);
                bad = 1;
            }
        } else if (!strncmp(key, "file.", 5)) {
            snprintf(errbuf, errlen,
                     "Block protocol 'file' doesn't support the option '%s'",
                     key + 5);
            bad = 1;
        } else {
            io->driver_opts = realloc(io->driver_opts,
                                      sizeof(char *) * (io->n_driver_opts + 2));
            if (!io->driver_opts) {
                abort();
            }
            io->driver_opts[io->n_driver_opts++] =
                bi_xasprintf("%s=%s", key, val);
            io->driver_opts[io->n_driver_opts] = NULL;
        }
        if (bad == -EINVAL) {
            snprintf(errbuf, errlen, "Parameter '%s' expects 'on' or 'off'",
                     key);
        }
        free(key);
        free(val);
        if (bad) {
            goto fail;
        }
    }
    if (!io->driver && !file_given) {
        snprintf(errbuf, errlen, "Must specify either driver or file");
        goto fail;
    }
    if (io->driver && !strcmp(io->driver, "file")) {
        /* the protocol node itself: "filename" names the file */
        if (file_given) {
            snprintf(errbuf, errlen,
                     "Block protocol 'file' doesn't support the option "
                     "'file'");
            goto fail;
        }
        free(io->filename);
        io->filename = plain_filename;
        plain_filename = NULL;
        if (!io->filename) {
            snprintf(errbuf, errlen,
                     "The 'file' block driver requires a "
                     "file name");
            goto fail;
        }
    } else if (plain_filename) {
        io->driver_opts =
            realloc(io->driver_opts, sizeof(char *) * (io->n_driver_opts + 2));
        if (!io->driver_opts) {
            abort();
        }
        io->driver_opts[io->n_driver_opts++] =
            bi_xasprintf("filename=%s", plain_filename);
        io->driver_opts[io->n_driver_opts] = NULL;
    }
    if (file_is_ref && file_ref) {
        /* file=<name> names another node; we have no node names */
        snprintf(errbuf, errlen, "Cannot find device='%s' nor node-name='%s'",
                 file_ref, file_ref);
        goto fail;
    }
    if (!io->filename) {
        snprintf(errbuf, errlen,
                 "A block device must be specified for \"file\"");
        goto fail;
    }
    free(file_ref);
    free(plain_filename);
    return 0;
fail:
    free(file_ref);
    free(plain_filename);
    tool_image_opts_free(io);
    return -EINVAL;
}

/* Runtime options of the format drivers that the library takes (as
 * driver_opts); anything else is refused as qemu refuses an unknown one. */
static int check_driver_opts(const char *driver, char *const *opts,
                             char *errbuf, size_t errlen)
{
    static const struct {
        const char *driver, *key;
        bool is_size;
    } known[] = {
        {"qcow2", "l2-cache-size", true},
        {"qcow2", "refcount-cache-size", true},
        {"qcow2", "data-file", false},
    };
    for (char *const *p = opts; p && *p; p++) {
        const char *eq = strchr(*p, '=');
        size_t kl = eq ? (size_t)(eq - *p) : strlen(*p);
        bool ok = false;
        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
            if (!strcmp(known[i].driver, driver) &&
                strlen(known[i].key) == kl && !strncmp(known[i].key, *p, kl)) {
                uint64_t v;
                if (known[i].is_size && bi_parse_size(eq + 1, &v) < 0) {
                    snprintf(errbuf, errlen,
                             "Parameter '%.*s' expects a non-negative "
                             "number below 2^64\n"
                             "Optional suffix k, M, G, T, P or E means "
                             "kilo-, mega-, giga-, tera-, peta-\n"
                             "and exabytes, respectively.",
                             (int)kl, *p);
                    return -EINVAL;
                }
                ok = true;
            }
        }
        if (!ok) {
            snprintf(errbuf, errlen,
                     "Block %s '%s' does not support the option '%.*s'",
                     strcmp(driver, "file") ? "format" : "protocol", driver,
                     (int)kl, *p);
            return -EINVAL;
        }
    }
    return 0;
}

/* The library's open message is "Could not open '<file>': <cause>"; with
 * --image-opts qemu names the option string instead. */
static const char *open_cause(const char *msg, const char *file)
{
    char *pre = bi_xasprintf("Could not open '%s': ", file);
    size_t l = strlen(pre);
    const char *r = strncmp(msg, pre, l) ? msg : msg + l;
    free(pre);
    return r;
}

bi_node *tool_open(struct tool_image *ti)
{
    struct bi_open_opts o;
    struct tool_image_opts io;
    const char *fname = ti->filename;
    enum bi_cache cache = ti->cache;
    bi_error err;
    bi_node *n;
    bool aio_set = ti->aio_set;
    enum bi_aio aio = ti->aio;

    bi_open_opts_init(&o);
    memset(&io, 0, sizeof(io));
    o.format = ti->fmt;
    o.read_write = ti->read_write;
    o.force_share = ti->force_share;
    o.no_backing = ti->no_backing;
    o.quiet_probe = ti->quiet_probe;
    o.metadata_only = ti->metadata_only;
    o.named_by_options = ti->image_opts;

    if (ti->image_opts) {
        char msg[1024];
        if (ti->fmt) {
            tool_error("--image-opts and --format are mutually exclusive");
            return NULL;
        }
        msg[0] = 0;
        if (tool_parse_image_opts(ti->filename, &io, msg, sizeof(msg)) < 0 ||
            (io.driver && check_driver_opts(io.driver, io.driver_opts, msg,
                                            sizeof(msg)) < 0)) {
            tool_error("Could not open '%s': %s", ti->filename, msg);
            tool_image_opts_free(&io);
            return NULL;
        }
        if (ti->force_share && io.has_force_share && !io.force_share) {
            tool_error("--force-share/-U conflicts with image options");
            tool_image_opts_free(&io);
            return NULL;
        }
        if (io.has_force_share) {
            o.force_share = io.force_share || ti->force_share;
        }
        if (io.has_locking) {
            o.no_lock = !io.locking;
        }
        if (io.has_direct || io.has_no_flush) {
            bool direct = bi_cache_is_direct(cache);
            bool no_flush = cache == BI_CACHE_UNSAFE;
            bool wt =
                cache == BI_CACHE_WRITETHROUGH || cache == BI_CACHE_DIRECTSYNC;
            if (io.has_direct) {
                direct = io.direct;
            }
            if (io.has_no_flush) {
                no_flush = io.no_flush;
            }
            if (no_flush) {
                cache = BI_CACHE_UNSAFE;
            } else if (direct) {
                cache = wt ? BI_CACHE_DIRECTSYNC : BI_CACHE_NONE;
            } else {
                cache = wt ? BI_CACHE_WRITETHROUGH : BI_CACHE_WRITEBACK;
            }
        }
        if (io.has_aio) {
            aio_set = true;
            aio = io.aio;
        }
        o.format = io.driver;
        o.driver_opts = (const char *const *)io.driver_opts;
        fname = io.filename;
    }
    o.cache = cache;
    o.backing_cache = cache;
    ti->cache = cache; /* as the image options made it */
    if (ti->image_opts && io.has_read_only && io.read_only) {
        o.read_write = false;
    }
    if (o.force_share && o.read_write) {
        tool_error("Could not open '%s': force-share=on can only be used "
                   "with read-only images",
                   ti->filename);
        tool_image_opts_free(&io);
        return NULL;
    }

    bi_error_init(&err);
    if (aio_set) {
        if (aio == BI_AIO_NATIVE && !bi_cache_is_direct(cache)) {
            tool_error("Could not open '%s': aio=native was specified, but "
                       "it requires cache.direct=on, which was not "
                       "specified.",
                       ti->filename);
            tool_image_opts_free(&io);
            return NULL;
        }
        if (bi_aio_select(aio, &err) < 0) {
            tool_error("Could not open '%s': %s", ti->filename,
                       err.msg[0] ? err.msg : strerror(-err.code));
            tool_image_opts_free(&io);
            return NULL;
        }
    }
    n = bi_open(fname, &o, &err);
    if (n && ti->image_opts && !io.driver) {
        char msg[1024];
        if (check_driver_opts(bi_node_format(n), io.driver_opts, msg,
                              sizeof(msg)) < 0) {
            tool_error("Could not open '%s': %s", ti->filename, msg);
            bi_close(n, NULL);
            n = NULL;
            tool_image_opts_free(&io);
            return NULL;
        }
    }
    if (!n) {
        if (ti->image_opts) {
            tool_error("Could not open '%s': %s", ti->filename,
                       open_cause(err.msg, fname));
        } else {
            tool_report(&err);
        }
    }
    tool_image_opts_free(&io);
    return n;
}

/* -------------------------------------------------- QEMU-ordered JSON */

struct qentry {
    char *key;
    struct qobj *v;
};

struct qobj {
    enum qobj_type type;
    int64_t i;
    bool is_unsigned;
    char *s;
    /* dict entries (insertion order) or list items */
    int n, cap;
    struct qentry *e;
};

static struct qobj *qobj_new(enum qobj_type t)
{
    struct qobj *o = bi_xzalloc(sizeof(*o));
    o->type = t;
    return o;
}

struct qobj *qobj_dict(void)
{
    return qobj_new(QOBJ_DICT);
}
struct qobj *qobj_list(void)
{
    return qobj_new(QOBJ_LIST);
}

struct qobj *qobj_int(int64_t v)
{
    struct qobj *o = qobj_new(QOBJ_INT);
    o->i = v;
    return o;
}

struct qobj *qobj_uint(uint64_t v)
{
    struct qobj *o = qobj_new(QOBJ_INT);
    o->i = (int64_t)v;
    o->is_unsigned = true;
    return o;
}

struct qobj *qobj_str(const char *s)
{
    struct qobj *o = qobj_new(QOBJ_STR);
    o->s = bi_xstrdup(s ? s : "");
    return o;
}

struct qobj *qobj_bool(bool v)
{
    struct qobj *o = qobj_new(QOBJ_BOOL);
    o->i = v;
    return o;
}

static void qobj_add(struct qobj *c, const char *key, struct qobj *v)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 8;
        c->e = realloc(c->e, sizeof(*c->e) * (size_t)c->cap);
        if (!c->e) {
            abort();
        }
    }
    c->e[c->n].key = key ? bi_xstrdup(key) : NULL;
    c->e[c->n].v = v;
    c->n++;
}

void qobj_put(struct qobj *dict, const char *key, struct qobj *v)
{
    for (int i = 0; i < dict->n; i++) {
        if (!strcmp(dict->e[i].key, key)) {
            qobj_free(dict->e[i].v);
            dict->e[i].v = v;
            return;
        }
    }
    qobj_add(dict, key, v);
}

void qobj_append(struct qobj *list, struct qobj *v)
{
    qobj_add(list, NULL, v);
}

struct qobj *qobj_get(const struct qobj *dict, const char *key)
{
    if (!dict || dict->type != QOBJ_DICT) {
        return NULL;
    }
    for (int i = 0; i < dict->n; i++) {
        if (!strcmp(dict->e[i].key, key)) {
            return dict->e[i].v;
        }
    }
    return NULL;
}

void qobj_free(struct qobj *o)
{
    if (!o) {
        return;
    }
    for (int i = 0; i < o->n; i++) {
        free(o->e[i].key);
        qobj_free(o->e[i].v);
    }
    free(o->e);
    free(o->s);
    free(o);
}

/* QDict's hash (QDICT_BUCKET_MAX = 512 buckets). */
static unsigned qdict_bucket(const char *name)
{
    unsigned value = 0x238F13AFu * (unsigned)strlen(name);
    for (unsigned i = 0; name[i]; i++) {
        value = value + ((unsigned)(unsigned char)name[i] << (i * 5 % 24));
    }
    return (1103515243u * value + 12345u) % 512u;
}

/* Dictionary members in QDict iteration order: buckets ascending, and in a
 * bucket the most recently inserted first. */
static int *qdict_order(const struct qobj *d)
{
    int *idx = bi_xmalloc(sizeof(int) * (size_t)(d->n ? d->n : 1));
    unsigned *b = bi_xmalloc(sizeof(unsigned) * (size_t)(d->n ? d->n : 1));
    for (int i = 0; i < d->n; i++) {
        idx[i] = i;
        b[i] = qdict_bucket(d->e[i].key);
    }
    /* insertion sort: small dicts */
    for (int i = 1; i < d->n; i++) {
        int x = idx[i], j = i - 1;
        while (j >= 0 &&
               (b[idx[j]] > b[x] || (b[idx[j]] == b[x] && idx[j] < x))) {
            idx[j + 1] = idx[j];
            j--;
        }
        idx[j + 1] = x;
    }
    free(b);
    return idx;
}

void qobj_print_string(FILE *out, const char *s)
{
    bi_json_write_string(out, s);
}

/* A scalar: strings quoted and escaped for JSON, as they are for text. */
static void print_scalar(FILE *out, const struct qobj *o, bool json)
{
    switch (o->type) {
    case QOBJ_INT:
        if (o->is_unsigned) {
            fprintf(out, "%" PRIu64, (uint64_t)o->i);
        } else {
            fprintf(out, "%" PRId64, o->i);
        }
        break;
    case QOBJ_BOOL:
        fputs(o->i ? "true" : "false", out);
        break;
    case QOBJ_STR:
        if (json) {
            qobj_print_string(out, o->s);
        } else {
            fputs(o->s, out);
        }
        break;
    default:
        break;
    }
}

static void newline(FILE *out, int depth)
{
    fprintf(out, "\n%*s", 4 * depth, "");
}

static void print_json(FILE *out, const struct qobj *o, int depth)
{
    if (o->type == QOBJ_DICT) {
        int *idx = qdict_order(o);
        fputc('{', out);
        for (int k = 0; k < o->n; k++) {
            const struct qentry *e = &o->e[idx[k]];
            if (k) {
                fputc(',', out);
            }
            newline(out, depth + 1);
            qobj_print_string(out, e->key);
            fputs(": ", out);
            print_json(out, e->v, depth + 1);
        }
        newline(out, depth);
        fputc('}', out);
        free(idx);
    } else if (o->type == QOBJ_LIST) {
        fputc('[', out);
        for (int k = 0; k < o->n; k++) {
            if (k) {
                fputc(',', out);
            }
            newline(out, depth + 1);
            print_json(out, o->e[k].v, depth + 1);
        }
        newline(out, depth);
        fputc(']', out);
    } else {
        print_scalar(out, o, true);
    }
}

void qobj_print_json(FILE *out, const struct qobj *o)
{
    print_json(out, o, 0);
    fputc('\n', out);
}

void qobj_print_human(FILE *out, int indentation, const struct qobj *o)
{
    if (o->type == QOBJ_DICT) {
        int *idx = qdict_order(o);
        for (int k = 0; k < o->n; k++) {
            const struct qentry *e = &o->e[idx[k]];
            bool composite = e->v->type == QOBJ_DICT || e->v->type == QOBJ_LIST;
            fprintf(out, "%*s", indentation * 4, "");
            for (const char *c = e->key; *c; c++) {
                fputc(*c == '-' ? ' ' : *c, out);
            }
            fputc(':', out);
            fputc(composite ? '\n' : ' ', out);
            qobj_print_human(out, indentation + 1, e->v);
            if (!composite) {
                fputc('\n', out);
            }
        }
        free(idx);
    } else if (o->type == QOBJ_LIST) {
        for (int k = 0; k < o->n; k++) {
            const struct qobj *v = o->e[k].v;
            bool composite = v->type == QOBJ_DICT || v->type == QOBJ_LIST;
            fprintf(out, "%*s[%i]:%c", indentation * 4, "", k,
                    composite ? '\n' : ' ');
            qobj_print_human(out, indentation + 1, v);
            if (!composite) {
                fputc('\n', out);
            }
        }
    } else {
        print_scalar(out, o, false);
    }
}

/* ---- a small JSON reader (for values the library hands over as text) */

struct jparse {
    const char *p;
    int depth;
};

static void jskip(struct jparse *j)
{
    while (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r') {
        j->p++;
    }
}

static void put_utf8(char **buf, size_t *n, unsigned cp)
{
    char *b = *buf;
    if (cp < 0x80) {
        b[(*n)++] = (char)cp;
    } else if (cp < 0x800) {
        b[(*n)++] = (char)(0xC0 | (cp >> 6));
        b[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        b[(*n)++] = (char)(0xE0 | (cp >> 12));
        b[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        b[(*n)++] = (char)(0xF0 | (cp >> 18));
        b[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        b[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static char *jstring(struct jparse *j)
{
    if (*j->p != '"') {
        return NULL;
    }
    j->p++;
    /* the raw string's length bounds the decoded one (escapes shrink) */
    const char *e = j->p;
    while (*e && *e != '"') {
        e += (*e == '\\' && e[1]) ? 2 : 1;
    }
    size_t cap = (size_t)(e - j->p) + 4, n = 0;
    char *buf = bi_xmalloc(cap);
    while (*j->p && *j->p != '"') {
        if (*j->p == '\\') {
            j->p++;
            switch (*j->p) {
            case '"':
            case '\\':
            case '/':
                buf[n++] = *j->p;
                break;
            case 'b':
                buf[n++] = '\b';
                break;
            case 'f':
                buf[n++] = '\f';
                break;
            case 'n':
                buf[n++] = '\n';
                break;
            case 'r':
                buf[n++] = '\r';
                break;
            case 't':
                buf[n++] = '\t';
                break;
            case 'u': {
                unsigned cp = 0;
                for (int i = 1; i <= 4; i++) {
                    if (!isxdigit((unsigned char)j->p[i])) {
                        free(buf);
                        return NULL;
                    }
                }
                sscanf(j->p + 1, "%4x", &cp);
                j->p += 4;
                if (cp >= 0xD800 && cp < 0xDC00 && j->p[1] == '\\' &&
                    j->p[2] == 'u') {
                    unsigned lo = 0;
                    if (sscanf(j->p + 3, "%4x", &lo) == 1 && lo >= 0xDC00 &&
                        lo < 0xE000) {
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        j->p += 6;
                    }
                }
                put_utf8(&buf, &n, cp);
                break;
            }
            default:
                free(buf);
                return NULL;
            }
            j->p++;
        } else {
            buf[n++] = *j->p++;
        }
    }
    if (*j->p != '"') {
        free(buf);
        return NULL;
    }
    j->p++;
    buf[n] = 0;
    return buf;
}

static struct qobj *jvalue(struct jparse *j)
{
    jskip(j);
    if (++j->depth > 64) {
        return NULL;
    }
    struct qobj *o = NULL;
    if (*j->p == '{') {
        j->p++;
        o = qobj_dict();
        jskip(j);
        if (*j->p == '}') {
            j->p++;
            goto done;
        }
        for (;;) {
            jskip(j);
            char *k = jstring(j);
            if (!k) {
                goto bad;
            }
            jskip(j);
            if (*j->p != ':') {
                free(k);
                goto bad;
            }
            j->p++;
            struct qobj *v = jvalue(j);
            if (!v) {
                free(k);
                goto bad;
            }
            qobj_put(o, k, v);
            free(k);
            jskip(j);
            if (*j->p == ',') {
                j->p++;
                continue;
            }
            if (*j->p == '}') {
                j->p++;
                break;
            }
            goto bad;
        }
    } else if (*j->p == '[') {
        j->p++;
        o = qobj_list();
        jskip(j);
        if (*j->p == ']') {
            j->p++;
            goto done;
        }
        for (;;) {
            struct qobj *v = jvalue(j);
            if (!v) {
                goto bad;
            }
            qobj_append(o, v);
            jskip(j);
            if (*j->p == ',') {
                j->p++;
                continue;
            }
            if (*j->p == ']') {
                j->p++;
                break;
            }
            goto bad;
        }
    } else if (*j->p == '"') {
        char *s = jstring(j);
        if (!s) {
            return NULL;
        }
        o = qobj_str(s);
        free(s);
    } else if (!strncmp(j->p, "true", 4)) {
        j->p += 4;
        o = qobj_bool(true);
    } else if (!strncmp(j->p, "false", 5)) {
        j->p += 5;
        o = qobj_bool(false);
    } else if (*j->p == '-' || isdigit((unsigned char)*j->p)) {
        char *end;
        errno = 0;
        if (*j->p == '-') {
            long long v = strtoll(j->p, &end, 10);
            o = qobj_int(v);
        } else {
            unsigned long long v = strtoull(j->p, &end, 10);
            o = v > INT64_MAX ? qobj_uint(v) : qobj_int((int64_t)v);
        }
        if (end == j->p || errno) {
            qobj_free(o);
            return NULL;
        }
        j->p = end;
    } else {
        return NULL;
    }
done:
    j->depth--;
    return o;
bad:
    qobj_free(o);
    return NULL;
}

struct qobj *qobj_from_json(const char *text)
{
    struct jparse j = {text, 0};
    struct qobj *o = jvalue(&j);
    if (!o) {
        return NULL;
    }
    jskip(&j);
    if (*j.p) {
        qobj_free(o);
        return NULL;
    }
    return o;
}
