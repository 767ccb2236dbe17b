/* SPDX-License-Identifier: MIT */
/* Building and tearing down node graphs: format over protocol, backing
 * chains, and the accessors the tools use. */
#include "block/block.h"
#include "io/aio.h"
#include "util/util.h"

#include <assert.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_BACKING_DEPTH 256
/* QEMU sizes block nodes in 512-byte sectors; so do we, for images. */
#define SECTOR 512

void bi_open_opts_init_sized(struct bi_open_opts *o, size_t size)
{
    memset(o, 0, size);
    if (size < sizeof(*o)) {
        /* a program built with an older header: its fields only */
        struct bi_open_opts full;
        bi_open_opts_init(&full);
        bi_struct_out(o, size, &full, sizeof(full));
        o->struct_size = size;
        return;
    }
    o->struct_size = sizeof(*o);
    o->cache = BI_CACHE_WRITEBACK;
    o->backing_cache = BI_CACHE_WRITEBACK;
}

static bi_node *node_alloc(const struct bi_driver *drv, const char *filename,
                           const struct bi_open_opts *o)
{
    bi_node *n = bi_xzalloc(sizeof(*n));
    n->drv = drv;
    n->filename = bi_xstrdup(filename);
    n->opts = *o;
    n->cache = o->cache;
    n->read_only = !o->read_write;
    LIST_INIT(&n->tracked);
    if (drv->state_size)
        n->opaque = bi_xzalloc(drv->state_size);
    return n;
}

void bi_node_free(bi_node *n)
{
    if (!n)
        return;
    free(n->opaque);
    free(n->filename);
    bi_value_free(n->name_opts);
    free(n->backing_filename);
    free(n->backing_format);
    free(n);
}

void bi_limits_any_range(struct bi_limits *l, uint64_t max_transfer)
{
    l->request_alignment = 1;
    l->request_alignment_source = BI_SRC_DRIVER;
    l->max_transfer = max_transfer;
}

void bi_limits_any_buffer(struct bi_limits *l, uint64_t max_transfer)
{
    memset(l, 0, sizeof(*l));
    bi_limits_any_range(l, max_transfer);
    l->min_mem_alignment = 1;
    l->mem_alignment_source = BI_SRC_DRIVER;
}

static void default_limits(bi_node *n)
{
    if (n->drv->refresh_limits) {
        n->drv->refresh_limits(n);
    } else if (n->file) {
        n->limits = n->file->limits;
        n->limits.request_alignment_source = BI_SRC_CHILD;
        n->limits.mem_alignment_source = BI_SRC_CHILD;
    }
    struct bi_limits *l = &n->limits;
    if (!l->request_alignment)
        l->request_alignment = 1;
    if (!l->min_mem_alignment)
        l->min_mem_alignment = 1;
    if (l->opt_mem_alignment < bi_page_size())
        l->opt_mem_alignment = (uint32_t)bi_page_size();
    if (l->opt_mem_alignment < l->min_mem_alignment)
        l->opt_mem_alignment = l->min_mem_alignment;
}

const struct bi_driver *bi_protocol_for(const char *filename)
{
    size_t plen = filename ? strcspn(filename, ":/") : 0;

    if (!filename || filename[plen] != ':')
        return bi_create_protocol(); /* local files */
    const struct bi_driver *d;
    for (int i = 0; (d = bi_driver_at(i)); i++) {
        for (const char *const *p = d->prefixes; p && *p; p++)
            if (strlen(*p) == plen && !strncmp(*p, filename, plen))
                return d;
    }
    return bi_create_protocol();
}

/* The protocol driver the open options name ("driver=NAME" among
 * protocol_opts), else the one filename's prefix names. NULL with err set
 * for a driver that is no protocol. */
static const struct bi_driver *choose_protocol(const char *filename,
                                               const struct bi_open_opts *o,
                                               bi_error *err)
{
    const char *name = NULL;

    for (const char *const *p = o->protocol_opts; p && *p; p++)
        if (!strncmp(*p, "driver=", 7))
            name = *p + 7;
    if (!name)
        return bi_protocol_for(filename);
    const struct bi_driver *drv = bi_driver_find(name);
    if (!drv || !drv->is_protocol) {
        bi_error_set(err, 0, "Unknown protocol '%s'", name);
        return NULL;
    }
    return drv;
}

/* Whether "driver=NAME" is among the protocol options. */
static bool protocol_named(const struct bi_open_opts *o)
{
    for (const char *const *p = o->protocol_opts; p && *p; p++)
        if (!strncmp(*p, "driver=", 7))
            return true;
    return false;
}

/* The options a protocol driver opens with: protocol_opts, then what its
 * file name says (for a name with its prefix; the driver refuses keys the
 * name contradicts). The strings of *out are owned by *l. */
static int protocol_options(const struct bi_driver *drv, const char *filename,
                            const struct bi_open_opts *o, struct bi_optlist *l,
                            char ***out, bi_error *err)
{
    for (const char *const *p = o->protocol_opts; p && *p; p++) {
        if (!strncmp(*p, "driver=", 7))
            continue;
        if (bi_optlist_add(l, *p) < 0) { /* one key=value each */
            bi_error_set(err, 0, "Invalid parameter '%s'", *p);
            return -EINVAL;
        }
    }
    if (filename && drv->parse_filename && bi_protocol_for(filename) == drv) {
        int ret = drv->parse_filename(filename, l, err);
        if (ret < 0)
            return ret;
    }
    *out = bi_xzalloc(sizeof(char *) * (size_t)(l->n + 1));
    for (int i = 0; i < l->n; i++)
        (*out)[i] = bi_xasprintf("%s=%s", l->v[i].key,
                                 l->v[i].value ? l->v[i].value : "on");
    return 0;
}

static void free_strv(char **v)
{
    for (char **p = v; p && *p; p++)
        free(*p);
    free(v);
}

/* The format driver the protocol options name (one standing as another
 * format's file: bi_driver.open_as_file), else NULL. */
static const struct bi_driver *file_format(const struct bi_open_opts *o)
{
    const char *name = NULL;

    for (const char *const *p = o->protocol_opts; p && *p; p++)
        if (!strncmp(*p, "driver=", 7))
            name = *p + 7;
    const struct bi_driver *drv = name ? bi_driver_find(name) : NULL;
    return drv && !drv->is_protocol ? drv : NULL;
}

bi_node *bi_open_filter_over(const struct bi_driver *drv, bi_node *child,
                             const char *filename, const struct bi_open_opts *o,
                             bi_error *err)
{
    assert(drv->is_protocol && child);
    struct bi_open_opts fo = *o;
    fo.read_write = !child->read_only;
    bi_node *n = node_alloc(drv, filename, &fo);
    n->opts.protocol_opts = NULL; /* not kept past open */
    n->file = child;
    child->parent = n;
    int ret = drv->open(n, &fo, err);
    if (ret < 0) {
        n->file = NULL;
        child->parent = NULL;
        bi_node_free(n);
        return NULL;
    }
    default_limits(n);
    return n;
}

bi_node *bi_open_protocol(const char *filename, const struct bi_open_opts *o,
                          bi_error *err)
{
    const struct bi_driver *fmt = file_format(o);
    if (fmt && !fmt->open_as_file) {
        bi_error_set(err, 0,
                     "The '%s' format cannot be another format's file in "
                     "blkimg",
                     fmt->name);
        return NULL;
    }
    if (fmt)
        return fmt->open_as_file(filename, o, err);
    const struct bi_driver *drv = choose_protocol(filename, o, err);
    if (!drv)
        return NULL;
    if (!drv->prefixes && !filename) {
        bi_error_set(err, 0, "The '%s' block driver requires a file name",
                     drv->name);
        return NULL;
    }
    struct bi_optlist l = {0};
    char **keys = NULL;
    int ret = protocol_options(drv, filename, o, &l, &keys, err);
    struct bi_open_opts po = *o;
    po.protocol_opts = (const char *const *)keys;
    bi_node *n = NULL;
    if (ret == 0) {
        n = node_alloc(drv, filename ? filename : drv->name, &po);
        n->opts.protocol_opts = NULL; /* not kept past open */
        n->driver_named = protocol_named(o);
        ret = n->drv->open(n, &po, err);
        if (ret < 0) {
            bi_node_free(n);
            n = NULL;
        }
    }
    bi_optlist_free(&l);
    free_strv(keys);
    if (n)
        default_limits(n);
    return n;
}

int bi_node_set_perm(bi_node *n, unsigned perm, unsigned shared, bi_error *err)
{
    if (!n || !n->drv->set_perm)
        return 0;
    return n->drv->set_perm(n, perm, shared, err);
}

static void close_graph(bi_node *n)
{
    if (!n)
        return;
    bi_node *file = n->file, *backing = n->backing;
    if (n->drv->close)
        n->drv->close(n);
    bi_node_free(n);
    if (file && file != n)
        close_graph(file);
    close_graph(backing);
}

/* Resolves a backing name against the directory of the image naming it. */
static char *resolve_backing(const char *image, const char *backing)
{
    if (backing[0] == '/')
        return bi_xstrdup(backing);
    char *copy = bi_xstrdup(image);
    char *dir = dirname(copy);
    char *r = strcmp(dir, ".") ? bi_xasprintf("%s/%s", dir, backing)
                               : bi_xstrdup(backing);
    free(copy);
    return r;
}

/* Names coming from an image are plain local file names. */
static bool plain_file_name(const char *name)
{
    if (!strncmp(name, "json:", 5))
        return false;
    const char *colon = strchr(name, ':');
    const char *slash = strchr(name, '/');
    /* "proto:..." before any slash is a protocol prefix in QEMU. */
    return !(colon && (!slash || colon < slash));
}

/* The driver's strong runtime options among o's (BI_OPT_STRONG), as an
 * object for the node's json: name; NULL when none is given. */
static bi_value *strong_opts(const struct bi_driver *drv,
                             const struct bi_open_opts *o)
{
    bi_value *v = NULL;
    for (const char *const *p = o->driver_opts; p && *p; p++) {
        const char *eq = strchr(*p, '=');
        if (!eq)
            continue;
        char *key = bi_xasprintf("%.*s", (int)(eq - *p), *p);
        const struct bi_opt_desc *d = bi_opt_lookup(drv->runtime_opts, key);
        if (d && (d->flags & BI_OPT_STRONG)) {
            if (!v)
                v = bi_value_object();
            bi_value_set_string(v, key, eq + 1);
        }
        free(key);
    }
    return v;
}

static bi_node *open_format(const char *filename, const char *format,
                            const struct bi_open_opts *o, int depth,
                            char **chain, bi_error *err);

/* The driver options of the backing file among opts: QEMU's "backing.*"
 * keys without the prefix (e.g. backing.encrypt.key-secret), as a
 * NULL-terminated array pointing into opts (free the array only); NULL
 * when there are none. */
static const char **backing_opts(const char *const *opts)
{
    static const char pre[] = "backing.";
    size_t cnt = 0, k = 0;
    for (const char *const *p = opts; p && *p; p++)
        cnt += !strncmp(*p, pre, sizeof(pre) - 1);
    if (!cnt)
        return NULL;
    const char **v = bi_xmalloc((cnt + 1) * sizeof(*v));
    for (const char *const *p = opts; *p; p++)
        if (!strncmp(*p, pre, sizeof(pre) - 1))
            v[k++] = *p + sizeof(pre) - 1;
    v[k] = NULL;
    return v;
}

/* backing.* options with no backing file to take them, refused as QEMU
 * refuses them: left over where the backing file is not opened (info,
 * rebase -u), or naming no file where the image has none. 0 or -EINVAL. */
static int check_unused_backing_opts(const bi_node *n,
                                     const struct bi_open_opts *o,
                                     bi_error *err)
{
    bool has_file = n->backing_filename && n->backing_filename[0];
    const char **bopts = backing_opts(o->driver_opts);
    int ret = 0;
    if (bopts && o->no_backing) {
        size_t kl = strcspn(bopts[0], "=");
        bi_error_set(err, 0,
                     "Block format '%s' does not support the option "
                     "'backing.%.*s'",
                     n->drv->name, (int)kl, bopts[0]);
        ret = -EINVAL;
    } else if (bopts && !has_file) {
        bi_error_set(err, 0,
                     "Could not open backing file: Must specify "
                     "either driver or file");
        ret = -EINVAL;
    }
    free(bopts);
    return ret;
}

static int open_backing(bi_node *n, const struct bi_open_opts *o, int depth,
                        char **chain, bi_error *err)
{
    int ret = check_unused_backing_opts(n, o, err);
    if (ret < 0)
        return ret;
    if (!n->backing_filename || !n->backing_filename[0] || o->no_backing)
        return 0;
    if (!plain_file_name(n->backing_filename)) {
        bi_error_set(err, 0,
                     "Could not open backing file '%s' of '%s': only local "
                     "file names are allowed",
                     n->backing_filename, n->filename);
        return -EINVAL;
    }
    if (depth + 1 >= MAX_BACKING_DEPTH) {
        bi_error_set(err, 0, "Backing chain of '%s' is too deep", n->filename);
        return -ELOOP;
    }
    char *path = resolve_backing(n->filename, n->backing_filename);
    char real[PATH_MAX];
    if (realpath(path, real)) {
        for (int i = 0; i <= depth; i++) {
            if (chain[i] && !strcmp(chain[i], real)) {
                bi_error_set(err, 0,
                             "Backing file '%s' of '%s' forms a loop in the "
                             "backing chain",
                             n->backing_filename, n->filename);
                free(path);
                return -ELOOP;
            }
        }
    }
    struct bi_open_opts bo = *o;
    bo.format = n->backing_format;
    bo.read_write = false;
    bo.cache = o->backing_cache;
    bo.quiet_probe = true;
    bo.named_by_options = false; /* QEMU probes a backing file by name */
    const char **bopts = backing_opts(o->driver_opts);
    bo.driver_opts = bopts;
    bo.protocol_opts = NULL;
    bi_error berr;
    bi_error_init(&berr);
    n->backing =
        open_format(path, n->backing_format, &bo, depth + 1, chain, &berr);
    free(bopts);
    if (!n->backing) {
        bi_error_set(err, 0, "Could not open backing file: %s", berr.msg);
        free(path);
        return berr.code ? berr.code : -EIO;
    }
    n->backing->parent = n;
    free(path);
    return 0;
}

/* Refuses a format that blkimg recognises but cannot open (no open in its
 * table): sets err and returns -ENOTSUP; 0 for any other driver. A backing
 * file (depth > 0) is named in the message; the caller of bi_open names
 * the image itself. */
static int refuse_unopenable(const struct bi_driver *drv, const char *filename,
                             int depth, bi_error *err)
{
    if (drv->open)
        return 0;
    if (depth > 0)
        return bi_error_setc(err, -ENOTSUP,
                             "Could not open '%s': Image format '%s' is not "
                             "supported by blkimg yet",
                             filename, drv->name);
    return bi_error_setc(err, -ENOTSUP,
                         "Image format '%s' is not supported by blkimg yet",
                         drv->name);
}

/* Probes the format of the image on file as QEMU 7.2 does: an empty file
 * is raw; otherwise the first BI_PROBE_BYTES bytes (zeroes past the end)
 * and the name decide (bi_probe_format). Returns the driver, or NULL with
 * err set when the bytes cannot be read. */
static const struct bi_driver *probe_format(bi_node *file, const char *filename,
                                            bi_error *err)
{
    if (file->size == 0)
        return bi_probe_fallback();
    uint8_t *buf =
        bi_alloc_aligned(file->limits.opt_mem_alignment, BI_PROBE_BYTES);
    if (!buf)
        abort();
    memset(buf, 0, BI_PROBE_BYTES);
    /* whole sectors: the request alignment of O_DIRECT files allows it */
    uint64_t l =
        BI_MIN((uint64_t)BI_PROBE_BYTES, bi_align_up(file->size, SECTOR));
    int ret = bi_pread(file, 0, buf, l);
    const struct bi_driver *drv = NULL;
    if (ret < 0)
        bi_error_set(err, -ret,
                     "Could not read image for determining its format");
    else
        drv = bi_probe_format(buf, BI_PROBE_BYTES, filename);
    bi_free_aligned(buf);
    return drv;
}

static bi_node *open_format(const char *filename, const char *format,
                            const struct bi_open_opts *o, int depth,
                            char **chain, bi_error *err)
{
    const struct bi_driver *drv = NULL;
    if (format) {
        drv = bi_driver_find(format);
        if (!drv) {
            bi_error_set(err, 0, "Unknown driver '%s'", format);
            return NULL;
        }
        if (refuse_unopenable(drv, filename, depth, err) < 0)
            return NULL;
    }
    struct bi_open_opts fo = *o;
    if (drv && drv->is_protocol) {
        /* -f file, driver=nbd: the protocol node is the image. */
        const char *name = bi_xasprintf("driver=%s", drv->name);
        const char **popts = bi_xzalloc(sizeof(char *));
        size_t np = 0;
        popts[np++] = name;
        for (const char *const *p = o->protocol_opts; p && *p; p++) {
            popts = realloc(popts, sizeof(char *) * (np + 2));
            if (!popts)
                abort();
            popts[np++] = *p;
        }
        popts = realloc(popts, sizeof(char *) * (np + 1));
        if (!popts)
            abort();
        popts[np] = NULL;
        fo.protocol_opts = popts;
        bi_node *file = bi_open_protocol(filename, &fo, err);
        free((char *)name);
        free(popts);
        if (file) /* sized in sectors, as QEMU sizes block nodes */
            file->size = bi_align_up(file->size, SECTOR);
        return file;
    }
    bi_node *file = bi_open_protocol(filename, o, err);
    if (!file)
        return NULL;
    if (!filename || file->drv != &bi_drv_file)
        filename = file->filename; /* a network protocol's canonical name */

    char real[PATH_MAX];
    chain[depth] = !file->drv->prefixes && realpath(filename, real)
                       ? bi_xstrdup(real)
                       : NULL;

    bool probed = false;
    if (!drv) {
        drv = probe_format(file, o->named_by_options ? NULL : filename, err);
        if (!drv || refuse_unopenable(drv, filename, depth, err) < 0) {
            close_graph(file);
            return NULL;
        }
        probed = drv->identity_map;
    }

    /* Image locking as QEMU 7.2: a format with metadata forbids other
     * writers (and resizers) of its file; raw shares what its user shares. */
    if (!drv->identity_map &&
        bi_node_set_perm(
            file,
            BI_PERM_CONSISTENT_READ |
                (o->read_write ? BI_PERM_WRITE | BI_PERM_RESIZE : 0),
            BI_PERM_ALL & ~(BI_PERM_WRITE | BI_PERM_RESIZE), err) < 0) {
        close_graph(file);
        return NULL;
    }

    /* A protocol node named json:{...} (it has no plain name, as QEMU's
     * rbd) names its format node json:{"driver": FMT, "file": {...}}, as
     * QEMU's bdrv_refresh_filename does. */
    char *wrapped = !strncmp(file->filename, "json:{", 6)
                        ? bi_xasprintf("json:{\"driver\": \"%s\", "
                                       "\"file\": %s}",
                                       drv->name, file->filename + 5)
                        : NULL;
    bi_node *n = node_alloc(drv, wrapped ? wrapped : filename, o);
    free(wrapped);
    n->file = file;
    file->parent = n;
    n->format_probed = probed;
    int ret = drv->open(n, o, err);
    if (ret < 0) {
        n->file = NULL;
        bi_node_free(n);
        close_graph(file);
        return NULL;
    }
    n->size = bi_align_up(n->size, SECTOR);
    default_limits(n);
    if (probed && !n->read_only && !o->quiet_probe) {
        bi_message(BI_MESSAGE_WARNING,
                   "WARNING: Image format was not specified for '%s' and "
                   "probing guessed raw.\n"
                   "         Automatically detecting the format is dangerous "
                   "for raw images, write operations on block 0 will be "
                   "restricted.\n"
                   "         Specify the 'raw' format explicitly to remove the "
                   "restrictions.",
                   filename);
    }
    if (open_backing(n, o, depth, chain, err) < 0) {
        close_graph(n);
        return NULL;
    }
    bi_value *strong = strong_opts(drv, o);
    if ((file->name_opts || strong) && file != n) {
        bi_value *v = strong ? strong : bi_value_object();
        bi_value_set_string(v, "driver", drv->name);
        bi_value *fv = file->name_opts ? bi_value_copy(file->name_opts)
                                       : bi_value_object();
        if (!file->name_opts) {
            bi_value_set_string(fv, "driver", file->drv->name);
            bi_value_set_string(fv, "filename", file->filename);
        }
        bi_value_set(v, "file", fv);
        free(n->filename);
        n->filename = bi_json_name(v);
        bi_value_free(v);
    }
    return n;
}

struct co_open_args {
    int (*fn)(bi_node *n, const struct bi_open_opts *o, bi_error *err);
    bi_node *n;
    const struct bi_open_opts *o;
    bi_error *err;
};

static int co_open_entry(void *arg)
{
    struct co_open_args *a = arg;
    return a->fn(a->n, a->o, a->err);
}

int bi_run_co_open(int (*fn)(bi_node *n, const struct bi_open_opts *o,
                             bi_error *err),
                   void (*cleanup)(bi_node *n), bi_node *n,
                   const struct bi_open_opts *o, bi_error *err)
{
    struct co_open_args a = {fn, n, o, err};
    int ret = bi_run_co(co_open_entry, &a);
    if (ret < 0 && cleanup)
        cleanup(n);
    return ret;
}

char *bi_json_name(const bi_value *v)
{
    char *s = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&s, &len);

    if (!f)
        abort();
    fputs("json:", f);
    bi_value_print_json(f, v, BI_VALUE_QDICT_ORDER);
    fclose(f);
    return s;
}

bi_node *bi_open_node(const char *filename, const char *format,
                      const struct bi_open_opts *o, bi_error *err)
{
    char *chain[MAX_BACKING_DEPTH] = {0};
    bi_node *n = open_format(filename, format, o, 0, chain, err);
    for (int i = 0; i < MAX_BACKING_DEPTH; i++)
        free(chain[i]);
    return n;
}

bi_node *bi_open(const char *filename, const struct bi_open_opts *o,
                 bi_error *err)
{
    struct bi_open_opts def;
    bi_open_opts_init(&def);
    if (o && bi_struct_in(&def, sizeof(def), o, o->struct_size) < 0) {
        bi_error_setc(err, -EINVAL,
                      "Could not open '%s': bi_open_opts of size %zu "
                      "(not set by bi_open_opts_init, or from a newer API)",
                      filename ? filename : "", o->struct_size);
        return NULL;
    }
    o = &def;
    bi_error local;
    bi_error_init(&local);
    bi_node *n = bi_open_node(filename, o->format, o, &local);
    if (!n) {
        /* qemu-img: "Could not open 'x': <cause>" */
        bi_error_setc(err, local.code ? local.code : -EIO,
                      "Could not open '%s': %s", filename ? filename : "",
                      local.msg);
    }
    return n;
}

struct close_args {
    bi_node *n;
    bi_node *failed; /* the node whose flush or close failed first */
    bool flush_failed;
};

static int close_flush(void *opaque)
{
    struct close_args *a = opaque;
    int ret = 0;
    for (bi_node *c = a->n; c; c = c->backing) {
        if (c->read_only)
            continue;
        /* QEMU flushes on close and then has the driver write its
         * caches once more, reporting only that second failure */
        int r = bi_co_flush(c);
        if (r < 0)
            r = bi_co_flush(c);
        if (r < 0 && ret == 0) {
            ret = r;
            a->failed = c;
            a->flush_failed = true;
        }
        if (r == 0 && c->drv->co_close_prepare) {
            r = c->drv->co_close_prepare(c);
            if (r < 0 && ret == 0) {
                ret = r;
                a->failed = c;
            }
        }
    }
    return ret;
}

int bi_close(bi_node *n, bi_error *err)
{
    if (!n)
        return 0;
    bi_aio_drain();
    struct close_args a = {n, NULL, false};
    int ret = bi_run_co(close_flush, &a);
    if (ret < 0)
        bi_error_set(err, -ret, "%s '%s'",
                     a.flush_failed ? "Failed to flush" : "Failed to close",
                     a.failed ? a.failed->filename : n->filename);
    close_graph(n);
    return ret;
}

const char *bi_node_filename(const bi_node *n)
{
    return n->filename;
}
const char *bi_node_format(const bi_node *n)
{
    return n->drv->name;
}
bi_node *bi_node_file(bi_node *n)
{
    return n->file ? n->file : n;
}
bi_node *bi_node_backing(bi_node *n)
{
    return n->backing;
}
bool bi_node_read_only(const bi_node *n)
{
    return n->read_only;
}
bool bi_node_format_probed(const bi_node *n)
{
    return n->format_probed;
}
int64_t bi_getlength(bi_node *n)
{
    return (int64_t)n->size;
}

int64_t bi_allocated_file_size(bi_node *n)
{
    if (n->drv->get_allocated_file_size)
        return n->drv->get_allocated_file_size(n);
    return n->file ? bi_allocated_file_size(n->file) : -ENOTSUP;
}

int bi_detect_zeroes_parse(const char *s, enum bi_detect_zeroes *out)
{
    static const char *const names[] = {"off", "on", "unmap"};
    for (int i = 0; i < 3; i++) {
        if (!strcmp(s, names[i])) {
            *out = (enum bi_detect_zeroes)i;
            return 0;
        }
    }
    return -EINVAL;
}

void bi_node_set_detect_zeroes(bi_node *n, enum bi_detect_zeroes dz)
{
    n->detect_zeroes = dz;
}

const struct bi_limits *bi_node_limits(const bi_node *n)
{
    return &n->limits;
}

int bi_storage_info_sized(bi_node *n, struct bi_storage_info *out, size_t size)
{
    struct bi_storage_info full;
    int ret = -ENOTSUP;

    memset(&full, 0, sizeof(full));
    full.page_size = (uint32_t)bi_page_size();
    bi_node *p = n;
    while (p && !p->drv->is_protocol)
        p = p->file;
    if (p && p->drv->storage_info)
        ret = p->drv->storage_info(p, &full);
    if (!full.filesystem)
        full.filesystem = "unknown";
    bi_struct_out(out, size, &full, sizeof(full));
    return ret;
}

void bi_node_stats_sized(const bi_node *n, struct bi_stats *out, size_t size)
{
    bi_struct_out(out, size, &n->stats, sizeof(n->stats));
}

void *bi_blockalign(bi_node *n, size_t size)
{
    size_t align = n && n->limits.opt_mem_alignment
                       ? n->limits.opt_mem_alignment
                       : bi_page_size();
    return bi_alloc_aligned(align, size ? size : align);
}

const char *bi_limit_source_name(enum bi_limit_source s)
{
    switch (s) {
    case BI_SRC_BUFFERED:
        return "buffered";
    case BI_SRC_STATX:
        return "statx";
    case BI_SRC_BLKSSZGET:
        return "BLKSSZGET";
    case BI_SRC_XFS_DIOINFO:
        return "XFS_IOC_DIOINFO";
    case BI_SRC_PROBE:
        return "probe";
    case BI_SRC_FALLBACK:
        return "fallback";
    case BI_SRC_CHILD:
        return "child";
    case BI_SRC_DRIVER:
        return "driver";
    case BI_SRC_SERVER:
        return "server";
    default:
        return "none";
    }
}

int bi_cache_parse(const char *s, enum bi_cache *out)
{
    static const char *const names[] = {"writeback", "none", "writethrough",
                                        "directsync", "unsafe"};
    for (int i = 0; i < 5; i++) {
        if (!strcmp(s, names[i])) {
            *out = (enum bi_cache)i;
            return 0;
        }
    }
    if (!strcmp(s, "off")) { /* qemu accepts "off" as an alias of none */
        *out = BI_CACHE_NONE;
        return 0;
    }
    return -EINVAL;
}

const char *bi_cache_name(enum bi_cache c)
{
    static const char *const names[] = {"writeback", "none", "writethrough",
                                        "directsync", "unsafe"};
    return (unsigned)c < 5 ? names[c] : "?";
}

bool bi_cache_is_direct(enum bi_cache c)
{
    return c == BI_CACHE_NONE || c == BI_CACHE_DIRECTSYNC;
}

int bi_prealloc_parse(const char *s, enum bi_prealloc *out)
{
    static const char *const names[] = {"off", "metadata", "falloc", "full"};
    for (int i = 0; i < 4; i++) {
        if (!strcmp(s, names[i])) {
            *out = (enum bi_prealloc)i;
            return 0;
        }
    }
    return -EINVAL;
}

const char *bi_prealloc_name(enum bi_prealloc p)
{
    static const char *const names[] = {"off", "metadata", "falloc", "full"};
    return (unsigned)p < 4 ? names[p] : "?";
}

struct truncate_args {
    bi_node *n;
    uint64_t size;
    bool exact;
    enum bi_prealloc prealloc;
    bi_error *err;
};

static int truncate_fn(void *opaque)
{
    struct truncate_args *a = opaque;
    if (!a->n->drv->co_truncate) {
        bi_error_set(a->err, 0, "Image format driver does not support resize");
        return -ENOTSUP;
    }
    return a->n->drv->co_truncate(a->n, a->size, a->exact, a->prealloc, a->err);
}

int bi_truncate(bi_node *n, uint64_t size, bool exact,
                enum bi_prealloc prealloc, bi_error *err)
{
    if (n->read_only) {
        bi_error_set(err, EACCES, "Image is read-only");
        return -EACCES;
    }
    struct truncate_args a = {n, size, exact, prealloc, err};
    int ret = bi_run_co(truncate_fn, &a);
    if (ret == 0 && !n->drv->is_protocol)
        n->size = bi_align_up(n->size, SECTOR);
    return ret;
}
