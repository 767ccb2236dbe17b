/* SPDX-License-Identifier: MIT */
/* Image creation: option bookkeeping and qemu-img's "Formatting" line as
 * data, from the drivers' option tables; the format driver does the work. */
#include "block/block.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* qemu's number options: a whole unsigned number in any base strtoull
 * reads. 0 or -EINVAL. */
static int parse_number(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || strchr(s, '-'))
        return -EINVAL;
    *out = v;
    return 0;
}

/* The value qemu-img's "Formatting" line shows for option d: given (the
 * last -o value, or what o carries for the options it has fields for),
 * sizes and numbers as qemu prints them (a signed 64-bit decimal), else
 * the default. NULL: not shown. num (32 bytes) holds numbers. */
static const char *line_value(const struct bi_opt_desc *d,
                              const struct bi_create_opts *o,
                              const struct bi_optlist *l, char *num)
{
    const char *v = bi_optlist_get(l, d->name);
    uint64_t x;
    if (!strcmp(d->name, "size")) {
        snprintf(num, 32, "%" PRIu64, o->size);
        return num;
    }
    if (!strcmp(d->name, "backing_file") && o->backing_file)
        return o->backing_file;
    if (!strcmp(d->name, "backing_fmt") && o->backing_fmt)
        return o->backing_fmt;
    if (!strcmp(d->name, "preallocation") && !v &&
        o->prealloc != BI_PREALLOC_OFF)
        return bi_prealloc_name(o->prealloc);
    if (!v)
        return d->def;
    if ((d->type == BI_OPT_SIZE && bi_parse_size(v, &x) == 0) ||
        (d->type == BI_OPT_NUMBER && parse_number(v, &x) == 0)) {
        snprintf(num, 32, "%" PRId64, (int64_t)x);
        return num;
    }
    return v;
}

/* Calls o->describe with the "Formatting" line's options: every creation
 * option of the format and of its protocol, in QEMU's order, that has a
 * value to show. */
static void describe(const char *filename, const struct bi_create_opts *o,
                     const struct bi_optlist *l)
{
    const struct bi_opt_desc **descs;
    int n;
    if (!o->describe ||
        bi_create_opt_list_at(o->format, filename, &descs, &n) < 0)
        return;
    char **items = bi_xzalloc(sizeof(char *) * (size_t)(n + 1));
    int k = 0;
    for (int i = 0; i < n; i++) {
        char num[32];
        const char *v = line_value(descs[i], o, l, num);
        if (v)
            items[k++] = bi_xasprintf("%s=%s", descs[i]->name, v);
    }
    o->describe(o->describe_opaque, filename, o->format,
                (const char *const *)items, k);
    for (int i = 0; i < k; i++)
        free(items[i]);
    free(items);
    free(descs);
}

/* "key=value" with commas in the value escaped as ",,". */
static char *escape_opt(const char *k, const char *v)
{
    if (!v)
        return bi_xstrdup(k);
    size_t n = strlen(k) + 2 * strlen(v) + 2;
    char *r = bi_xmalloc(n), *p = r;
    p += sprintf(p, "%s=", k);
    for (; *v; v++) {
        *p++ = *v;
        if (*v == ',')
            *p++ = ',';
    }
    *p = 0;
    return r;
}

/* The value a driver gets for option d given as v: a boolean as "on" or
 * "off" and a number in decimal, whichever of qemu's spellings was given
 * (yes/y/true, no/n/false; any base); anything else as given, for the
 * driver to refuse in its words. num (32 bytes) holds the result. */
static const char *canonical(const struct bi_opt_desc *d, const char *v,
                             char *num)
{
    static const char *const on[] = {"on", "yes", "y", "true", NULL};
    static const char *const off[] = {"off", "no", "n", "false", NULL};
    uint64_t x;
    if (!d || !v)
        return v;
    for (int i = 0; d->type == BI_OPT_BOOL && on[i]; i++) {
        if (!strcmp(v, on[i]))
            return "on";
        if (!strcmp(v, off[i]))
            return "off";
    }
    if (d->type == BI_OPT_NUMBER && parse_number(v, &x) == 0) {
        snprintf(num, 32, "%" PRIu64, x);
        return num;
    }
    return v;
}

/* The options of l split by owner: those only the local file protocol
 * takes (nocow, ...) into proto, the rest into fmt (both malloc'd
 * "key=value" lists, NULL-terminated; free with free_strv; values
 * canonical). size and preallocation, known to both, stay with the
 * format, and so do the options of a network protocol (rbd's
 * cluster_size), which its create reads from the format's. */
static void split_options(const struct bi_driver *drv, const char *filename,
                          const struct bi_optlist *l, char ***fmt,
                          char ***proto)
{
    const struct bi_driver *p = bi_protocol_for(filename);
    bool local = p == bi_create_protocol();
    int nf = 0, np = 0;
    *fmt = bi_xzalloc((size_t)(l->n + 1) * sizeof(char *));
    *proto = bi_xzalloc((size_t)(l->n + 1) * sizeof(char *));
    for (int i = 0; i < l->n; i++) {
        const char *k = l->v[i].key;
        const struct bi_opt_desc *own = bi_opt_lookup(drv->create_opts, k);
        const struct bi_opt_desc *theirs =
            p ? bi_opt_lookup(p->create_opts, k) : NULL;
        char num[32];
        const char *v = canonical(own ? own : theirs, l->v[i].value, num);
        bool generic = !strcmp(k, "size") || !strcmp(k, "preallocation");
        if (theirs && !own && !generic && local)
            (*proto)[np++] = escape_opt(k, v);
        else
            (*fmt)[nf++] = escape_opt(k, v);
    }
}

static void free_strv(char **v)
{
    for (char **p = v; p && *p; p++)
        free(*p);
    free(v);
}

/* Checks what the generic layer knows about o (with the -o list l folded
 * in) before anything is created; co receives backing_file, backing_fmt
 * and preallocation from l. Returns 0 or -errno with err set. */
static int check_generic(const struct bi_driver *drv,
                         const struct bi_optlist *l, struct bi_create_opts *co,
                         bi_error *err)
{
    const char *pre = bi_optlist_get(l, "preallocation");
    if (pre && bi_prealloc_parse(pre, &co->prealloc) < 0) {
        /* the words of the driver whose option it is */
        if (bi_opt_lookup(drv->create_opts, "preallocation"))
            bi_error_set(err, 0,
                         "Parameter 'preallocation' does not accept value "
                         "'%s'",
                         pre);
        else
            bi_error_set(err, 0, "invalid parameter value: %s", pre);
        return -EINVAL;
    }
    if (co->backing_fmt && !co->backing_file) {
        bi_error_set(err, 0,
                     "Backing format cannot be used without backing file");
        return -EINVAL;
    }
    return 0;
}

/* Prepares the file with the protocol's options, then has the format
 * driver create the image; a local file that did not exist before is
 * removed again on failure (an export of a network protocol is not ours
 * to remove, and takes no preparation). */
static int create_file(const char *filename, const struct bi_driver *drv,
                       const struct bi_create_opts *co, char **proto_opts,
                       bi_error *err)
{
    const struct bi_driver *p = bi_protocol_for(filename);
    bool local = p == bi_create_protocol();
    bool existed = !local || access(filename, F_OK) == 0;
    int ret = 0;
    if (local && p->create_prepare)
        ret = p->create_prepare(filename, (const char *const *)proto_opts, err);
    if (ret == 0)
        ret = drv->create(filename, co, err);
    if (ret < 0 && !existed)
        unlink(filename);
    return ret;
}

/* QEMU's fallback for protocols that cannot create (nbd): the storage
 * must exist and hold the size; its first sector is zeroed so that no old
 * header is probed. Returns 0 or -errno with err set. */
static int create_by_opening(const struct bi_driver *drv, const char *filename,
                             const struct bi_create_opts *o, bi_error *err)
{
    struct bi_open_opts oo;
    bi_error local;
    int ret;

    if (o->prealloc != BI_PREALLOC_OFF) {
        bi_error_set(err, 0, "Unsupported preallocation mode '%s'",
                     bi_prealloc_name(o->prealloc));
        return -ENOTSUP;
    }
    bi_open_opts_init(&oo);
    oo.read_write = true;
    bi_error_init(&local);
    bi_node *n = bi_open_protocol(filename, &oo, &local);
    if (!n) {
        bi_error_set(err, 0,
                     "Protocol driver '%s' does not support image creation, "
                     "and opening the image failed: %s",
                     drv->name, local.msg);
        return local.code ? local.code : -EIO;
    }
    ret = bi_truncate(n, o->size, false, BI_PREALLOC_OFF, err);
    if (ret == 0 && o->size) {
        ret = bi_pwrite_zeroes(n, 0, BI_MIN(o->size, 512), BI_REQ_MAY_UNMAP);
        if (ret < 0)
            bi_error_set(err, -ret,
                         "Failed to clear the new image's first sector");
    }
    int cret = bi_close(n, ret < 0 ? NULL : err);
    return ret < 0 ? ret : cret;
}

int bi_create_file(const char *filename, const struct bi_create_opts *o,
                   bi_error *err)
{
    const struct bi_driver *drv = bi_protocol_for(filename);

    if (drv->create)
        return drv->create(filename, o, err);
    return create_by_opening(drv, filename, o, err);
}

void bi_create_opts_init_sized(struct bi_create_opts *o, size_t size)
{
    memset(o, 0, size);
    o->struct_size = size < sizeof(*o) ? size : sizeof(*o);
}

int bi_create(const char *filename, const struct bi_create_opts *given,
              bi_error *err)
{
    struct bi_create_opts full;
    const struct bi_create_opts *o = &full;

    bi_create_opts_init(&full);
    if (bi_struct_in(&full, sizeof(full), given, given->struct_size) < 0)
        return bi_error_setc(err, -EINVAL,
                             "Could not create '%s': bi_create_opts of size "
                             "%zu (not set by bi_create_opts_init, or from a "
                             "newer API)",
                             filename, given->struct_size);
    const struct bi_driver *drv = bi_driver_find(o->format);
    if (!drv || drv->is_protocol) {
        bi_error_set(err, 0, "Unknown file format '%s'", o->format);
        return -EINVAL;
    }
    if (!drv->create) {
        bi_error_set(err, 0,
                     "Format driver '%s' does not support image "
                     "creation",
                     o->format);
        return -ENOTSUP;
    }
    struct bi_optlist l = {0};
    for (const char *const *p = o->options; p && *p; p++) {
        if (bi_optlist_parse(&l, *p) < 0) {
            bi_error_set(err, 0, "Invalid options: '%s'", *p);
            bi_optlist_free(&l);
            return -EINVAL;
        }
    }
    struct bi_create_opts co = *o;
    const char *bf = bi_optlist_get(&l, "backing_file");
    if (bf && !co.backing_file)
        co.backing_file = bf;
    const char *bfmt = bi_optlist_get(&l, "backing_fmt");
    if (bfmt && !co.backing_fmt)
        co.backing_fmt = bfmt;
    if (co.backing_fmt && !co.backing_file &&
        !bi_create_opt_find(o->format, "backing_fmt")) {
        bi_error_set(err, 0,
                     "%s: Backing file format not supported for file "
                     "format '%s'",
                     filename, o->format);
        bi_optlist_free(&l);
        return -ENOTSUP;
    }
    describe(filename, &co, &l);

    int ret = check_generic(drv, &l, &co, err);
    /* Nodes are sized in whole 512-byte sectors, as in QEMU. */
    co.size = bi_align_up(co.size, 512);
    char **fmt_opts, **proto_opts;
    split_options(drv, filename, &l, &fmt_opts, &proto_opts);
    co.options = (const char *const *)fmt_opts;
    if (ret == 0)
        ret = create_file(filename, drv, &co, proto_opts, err);
    free_strv(fmt_opts);
    free_strv(proto_opts);
    if (ret < 0 && err && err->msg[0] &&
        strncmp(err->msg, filename, strlen(filename)) != 0)
        bi_error_prefix(err, "%s", filename);
    bi_optlist_free(&l);
    return ret;
}
