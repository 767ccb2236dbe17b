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

/* The library's messages (warnings, check findings) go to stderr as they
 * are, as qemu-img prints its own; error lines with the program's name;
 * the lines QEMU prints on stdout (blkdebug's breakpoints) to stdout. */
static void print_message(void *opaque, enum bi_message_kind kind,
                          const char *message)
{
    (void)opaque;
    if (kind == BI_MESSAGE_INFO)
        printf("%s\n", message);
    else if (kind == BI_MESSAGE_ERROR)
        fprintf(stderr, "%s: %s\n", tool_prog, message);
    else
        fprintf(stderr, "%s\n", message);
}

void tool_install_message_handler(void)
{
    bi_set_message_handler(print_message, NULL);
}

void tool_init(const char *argv0)
{
    if (argv0 && *argv0) {
        const char *p = strrchr(argv0, '/');
        tool_prog = p ? p + 1 : argv0;
    }
    tool_install_message_handler();
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

static void strv_free(char **v, int n)
{
    for (int i = 0; v && i < n; i++) {
        free(v[i]);
    }
    free(v);
}

/* Appends item (taken) to the NULL-terminated list *v of *n items. */
static void strv_push(char ***v, int *n, char *item)
{
    *v = realloc(*v, sizeof(char *) * (size_t)(*n + 2));
    if (!*v) {
        abort();
    }
    (*v)[(*n)++] = item;
    (*v)[*n] = NULL;
}

void tool_image_opts_free(struct tool_image_opts *io)
{
    free(io->driver);
    free(io->filename);
    strv_free(io->driver_opts, io->n_driver_opts);
    strv_free(io->protocol_opts, io->n_protocol_opts);
    memset(io, 0, sizeof(*io));
}

/* A protocol driver other than file (nbd). */
static bool other_protocol(const char *name)
{
    int caps = bi_format_caps(name);
    return caps >= 0 && (caps & BI_FORMAT_PROTOCOL) && strcmp(name, "file");
}

/* A file.driver whose keys go to the library as the file's options: a
 * protocol other than file, or a format standing as the image format's
 * file (raw with offset and size in an OVA). */
static bool other_file_driver(const char *name)
{
    int caps = bi_format_caps(name);
    return other_protocol(name) || (caps >= 0 && (caps & BI_FORMAT_OPEN) &&
                                    !(caps & BI_FORMAT_PROTOCOL));
}

int tool_object_add(const char *def)
{
    bi_error err;

    int ret;

    bi_error_init(&err);
    ret = bi_object_add(def, &err);
    if (ret == -ENOTSUP) {
        /* a QEMU object blkimg has no use for (secrets, throttling) */
        tool_error("--object is not supported");
        return -1;
    }
    if (ret < 0) {
        tool_report(&err);
        return -1;
    }
    return 0;
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

/* Appends the members of object v to out as k=v pairs, keys under
 * prefix. -EINVAL for an array or null member. */
static int json_flatten(FILE *out, const bi_value *v, const char *prefix,
                        bool *first)
{
    for (int i = 0; i < bi_value_count(v); i++) {
        const char *key;
        const bi_value *m = bi_value_at(v, i, &key);
        char *full =
            prefix ? bi_xasprintf("%s.%s", prefix, key) : bi_xstrdup(key);
        int ret = 0;
        switch (bi_value_type(m)) {
        case BI_VALUE_OBJECT:
            ret = json_flatten(out, m, full, first);
            break;
        case BI_VALUE_STRING:
            fprintf(out, "%s%s=", *first ? "" : ",", full);
            for (const char *p = bi_value_get_string(m); *p; p++) {
                if (*p == ',') {
                    fputc(',', out); /* ",," is a literal comma */
                }
                fputc(*p, out);
            }
            *first = false;
            break;
        case BI_VALUE_BOOL:
            fprintf(out, "%s%s=%s", *first ? "" : ",", full,
                    bi_value_get_bool(m) ? "on" : "off");
            *first = false;
            break;
        case BI_VALUE_INT:
            if (bi_value_is_unsigned(m)) {
                fprintf(out, "%s%s=%" PRIu64, *first ? "" : ",", full,
                        (uint64_t)bi_value_get_int(m));
            } else {
                fprintf(out, "%s%s=%" PRId64, *first ? "" : ",", full,
                        bi_value_get_int(m));
            }
            *first = false;
            break;
        case BI_VALUE_NULL:
            fprintf(out, "%s%s=%s", *first ? "" : ",", full, TOOL_JSON_NULL);
            *first = false;
            break;
        default:
            ret = -EINVAL;
        }
        free(full);
        if (ret < 0) {
            return ret;
        }
    }
    return 0;
}

int tool_json_filename(const char *name, char **opts, char *errbuf,
                       size_t errlen)
{
    bi_value *v;
    size_t len = 0;
    bool first = true;
    FILE *out;
    int ret;

    *opts = NULL;
    if (strncmp(name, "json:", 5)) {
        return 0;
    }
    v = bi_value_parse_json(name + 5);
    if (!v) {
        snprintf(errbuf, errlen, "Could not parse the JSON options");
        return -EINVAL;
    }
    if (bi_value_type(v) != BI_VALUE_OBJECT) {
        snprintf(errbuf, errlen, "Invalid JSON object given");
        bi_value_free(v);
        return -EINVAL;
    }
    out = open_memstream(opts, &len);
    if (!out) {
        abort();
    }
    ret = json_flatten(out, v, NULL, &first);
    fclose(out);
    bi_value_free(v);
    if (ret < 0) {
        snprintf(errbuf, errlen,
                 "Invalid JSON options: arrays and null "
                 "are not supported");
        free(*opts);
        *opts = NULL;
        return ret;
    }
    return 1;
}

/* Whether name is a registered protocol driver (file, nbd...). */
static bool is_protocol_name(const char *name)
{
    int caps = bi_format_caps(name);
    return caps >= 0 && (caps & BI_FORMAT_PROTOCOL);
}

bool tool_backing_none(const char *val)
{
    if (!strcmp(val, TOOL_JSON_NULL)) {
        return true;
    }
    if (*val) {
        return false;
    }
    tool_error("warning: Use of \"backing\": \"\" is deprecated; use "
               "\"backing\": null instead");
    return true;
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
    char *file_protocol = NULL; /* file.driver naming nbd */
    bool file_named = false;    /* file.driver=file */
    char *proto_key = NULL;     /* locking or aio without "file." */
    bool deferred = false;      /* errbuf: a bad value of proto_key's */
    char **file_keys = NULL;    /* other file.* keys, "k=v" */
    int n_file_keys = 0;

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
            if (other_file_driver(val)) {
                free(file_protocol);
                file_protocol = val;
                val = NULL;
            } else if (strcmp(val, "file")) {
                snprintf(errbuf, errlen, "Unknown driver '%s'", val);
                bad = 1;
            } else {
                file_named = true;
            }
        } else if (!strcmp(key, "cache.direct") ||
                   !strcmp(key, "file.cache.direct")) {
            io->has_direct = true;
            bad = parse_bool(val, &io->direct);
        } else if (!strcmp(key, "cache.no-flush") ||
                   !strcmp(key, "file.cache.no-flush")) {
            io->has_no_flush = true;
            bad = parse_bool(val, &io->no_flush);
        } else if (!strcmp(key, "backing") && tool_backing_none(val)) {
            io->no_backing = true;
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
            if (key[0] != 'f') {
                free(proto_key);
                proto_key = bi_xstrdup(key);
            }
            if (strcmp(val, "auto") && parse_bool(val, &io->locking) < 0) {
                snprintf(errbuf, errlen, "invalid parameter value: %s", val);
                bad = key[0] == 'f' ? 1 : (deferred = true, 0);
            }
        } else if (!strcmp(key, "aio") || !strcmp(key, "file.aio")) {
            io->has_aio = true;
            if (key[0] != 'f') {
                free(proto_key);
                proto_key = bi_xstrdup(key);
            }
            if (bi_aio_parse(val, &io->aio) < 0) {
                snprintf(errbuf, errlen, "invalid parameter value: %s", val);
                bad = key[0] == 'f' ? 1 : (deferred = true, 0);
            }
        } else if (!strcmp(key, "discard")) {
            if (!strcmp(val, "unmap") || !strcmp(val, "on")) {
                io->discard_unmap = true;
            } else if (strcmp(val, "ignore") && strcmp(val, "off")) {
                snprintf(errbuf, errlen, "Invalid discard option");
                bad = 1;
            }
        } else if (!strcmp(key, "detect-zeroes")) {
            if (bi_detect_zeroes_parse(val, &io->detect_zeroes) < 0) {
                snprintf(errbuf, errlen, "invalid parameter value: %s", val);
                bad = 1;
            }
        } else if (!strncmp(key, "file.", 5)) {
            /* the protocol's key: checked once file.driver is known */
            strv_push(&file_keys, &n_file_keys,
                      bi_xasprintf("%s=%s", key + 5, val));
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
    if (proto_key && io->driver && !is_protocol_name(io->driver)) {
        /* the protocol's keys, not the format's */
        snprintf(errbuf, errlen,
                 "Block format '%s' does not support the option '%s'",
                 io->driver, proto_key);
        goto fail;
    }
    free(proto_key);
    proto_key = NULL;
    if (deferred) { /* the protocol's option, with a bad value */
        goto fail;
    }
    if (io->detect_zeroes == BI_DETECT_ZEROES_UNMAP && !io->discard_unmap) {
        snprintf(errbuf, errlen,
                 "setting detect-zeroes to unmap is not allowed without "
                 "setting discard operation to unmap");
        goto fail;
    }
    if (file_keys && !file_protocol) {
        const char *eq = strchr(file_keys[0], '=');
        snprintf(errbuf, errlen,
                 "Block protocol 'file' doesn't support the option '%.*s'",
                 (int)(eq - file_keys[0]), file_keys[0]);
        goto fail;
    }
    if (file_protocol || (io->driver && other_protocol(io->driver))) {
        /* nbd: its keys go to the protocol; the name may be absent */
        const char *proto = file_protocol ? file_protocol : io->driver;
        char **keys = file_protocol ? file_keys : io->driver_opts;
        int nk = file_protocol ? n_file_keys : io->n_driver_opts;
        strv_push(&io->protocol_opts, &io->n_protocol_opts,
                  bi_xasprintf("driver=%s", proto));
        for (int i = 0; i < nk; i++) {
            strv_push(&io->protocol_opts, &io->n_protocol_opts, keys[i]);
        }
        free(keys);
        if (file_protocol) {
            file_keys = NULL;
            n_file_keys = 0;
        } else {
            io->driver_opts = bi_xzalloc(sizeof(char *));
            io->n_driver_opts = 0;
        }
        if (plain_filename && !io->filename) {
            io->filename = plain_filename;
            plain_filename = NULL;
        }
        free(file_protocol);
        file_protocol = NULL;
        free(file_ref);
        free(plain_filename);
        return 0;
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
    if (file_named) { /* named, file opens regular files only */
        strv_push(&io->protocol_opts, &io->n_protocol_opts,
                  bi_xstrdup("driver=file"));
    }
    free(file_ref);
    free(plain_filename);
    return 0;
fail:
    free(proto_key);
    free(file_ref);
    free(plain_filename);
    free(file_protocol);
    strv_free(file_keys, n_file_keys);
    tool_image_opts_free(io);
    return -EINVAL;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

char *tool_driver_names(unsigned which, const char *sep, bool sorted)
{
    const char *v[64];
    int n = 0;
    const char *name;
    for (int pass = 0; pass < 2; pass++) {
        bool protocols = pass == 1;
        if (!(which & (protocols ? TOOL_PROTOCOLS : TOOL_FORMATS))) {
            continue;
        }
        for (int i = 0; (name = bi_driver_name(i)) && n < 64; i++) {
            int caps = bi_format_caps(name);
            bool is_proto = caps & BI_FORMAT_PROTOCOL;
            if ((caps & BI_FORMAT_OPEN) && is_proto == protocols) {
                v[n++] = name;
            }
        }
    }
    if (sorted) {
        qsort(v, (size_t)n, sizeof(v[0]), cmp_name);
    }
    char *s = bi_xstrdup("");
    for (int i = 0; i < n; i++) {
        char *t = bi_xasprintf("%s%s%s", s, i ? sep : "", v[i]);
        free(s);
        s = t;
    }
    return s;
}

/* Whether name is a registered protocol driver (file). */
static bool is_protocol(const char *name)
{
    int caps = bi_format_caps(name);
    return caps >= 0 && (caps & BI_FORMAT_PROTOCOL);
}

int tool_check_driver_opt(const char *driver, const char *kv, char *errbuf,
                          size_t errlen)
{
    size_t kl = strcspn(kv, "=");
    char *key = bi_xasprintf("%.*s", (int)kl, kv);
    const struct bi_opt_desc *d = bi_runtime_opt_find(driver, key);
    uint64_t v;
    int ret = -EINVAL;

    if (!d) {
        snprintf(errbuf, errlen,
                 "Block %s '%s' does not support the option "
                 "'%s'",
                 is_protocol(driver) ? "protocol" : "format", driver, key);
    } else if (d->flags & BI_OPT_REFUSED) {
        if (d->help) {
            snprintf(errbuf, errlen, "%s", d->help);
        } else {
            snprintf(errbuf, errlen,
                     "The %s format's option '%s' is not "
                     "supported",
                     driver, key);
        }
    } else if (d->type == BI_OPT_SIZE && kv[kl] &&
               bi_parse_size(kv + kl + 1, &v) < 0) {
        snprintf(errbuf, errlen,
                 "Parameter '%s' expects a non-negative number below 2^64\n"
                 "Optional suffix k, M, G, T, P or E means kilo-, mega-, "
                 "giga-, tera-, peta-\n"
                 "and exabytes, respectively.",
                 key);
    } else {
        ret = 0;
    }
    free(key);
    return ret;
}

/* Checks every "key=value" of opts against driver's runtime options. */
static int check_driver_opts(const char *driver, char *const *opts,
                             char *errbuf, size_t errlen)
{
    for (char *const *p = opts; p && *p; p++) {
        if (tool_check_driver_opt(driver, *p, errbuf, errlen) < 0) {
            return -EINVAL;
        }
    }
    return 0;
}

/* The library's open message is "Could not open '<file>': <cause>"; with
 * --image-opts qemu names the option string instead. */
const char *tool_open_cause(const char *msg, const char *file)
{
    char *pre = bi_xasprintf("Could not open '%s': ", file ? file : "");
    size_t l = strlen(pre);
    const char *r = strncmp(msg, pre, l) ? msg : msg + l;
    free(pre);
    return r;
}

/* tool_open for an image named by spec: options (by_opts: --image-opts or
 * a json: name turned into them) or a file name. */
static bi_node *open_image(struct tool_image *ti, const char *spec,
                           bool by_opts)
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
    o.named_by_options = by_opts;

    if (by_opts) {
        char msg[1024];
        if (ti->fmt && ti->image_opts) {
            tool_error("--image-opts and --format are mutually exclusive");
            return NULL;
        }
        msg[0] = 0;
        if (tool_parse_image_opts(spec, &io, msg, sizeof(msg)) < 0 ||
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
        if (io.no_backing) {
            o.no_backing = true;
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
        o.format = io.driver ? io.driver : ti->fmt; /* json: with -f */
        o.driver_opts = (const char *const *)io.driver_opts;
        o.protocol_opts = (const char *const *)io.protocol_opts;
        fname = io.filename;
    }
    o.cache = cache;
    o.backing_cache = cache;
    ti->cache = cache; /* as the image options made it */
    if (by_opts && io.has_read_only && io.read_only) {
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
    if (n && by_opts && !io.driver && !ti->fmt) {
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
    if (n && io.detect_zeroes != BI_DETECT_ZEROES_OFF) {
        bi_node_set_detect_zeroes(n, io.detect_zeroes);
    }
    if (!n) {
        if (by_opts) {
            tool_error("Could not open '%s': %s", ti->filename,
                       tool_open_cause(err.msg, fname));
        } else {
            tool_report(&err);
        }
    }
    tool_image_opts_free(&io);
    return n;
}

bi_node *tool_open(struct tool_image *ti)
{
    char *json = NULL, msg[1024] = "";
    bi_node *n;

    if (!ti->image_opts &&
        tool_json_filename(ti->filename, &json, msg, sizeof(msg)) < 0) {
        tool_error("Could not open '%s': %s", ti->filename, msg);
        return NULL;
    }
    n = open_image(ti, json ? json : ti->filename, ti->image_opts || json);
    free(json);
    return n;
}
