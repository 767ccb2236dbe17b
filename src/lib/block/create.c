/* SPDX-License-Identifier: MIT */
/* Image creation: option bookkeeping and qemu-img's "Formatting" line;
 * the format driver does the work. */
#include "block/block.h"
#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct line_key {
    const char *key;
    const char *def; /* printed when not given; NULL: only when given */
    bool is_size;
};

/* qemu-img 7.2 prints the creation options in its option table order. */
static const struct line_key raw_keys[] = {
    {"size", "", true},     {"preallocation", NULL, false},
    {"nocow", NULL, false}, {"extent_size_hint", NULL, true},
    {NULL, NULL, false},
};
static const struct line_key qcow2_keys[] = {
    {"cluster_size", "65536", true},
    {"extended_l2", "off", false},
    {"preallocation", NULL, false},
    {"compression_type", "zlib", false},
    {"size", "", true},
    {"compat", NULL, false},
    {"backing_file", NULL, false},
    {"backing_fmt", NULL, false},
    {"data_file", NULL, false},
    {"data_file_raw", NULL, false},
    {"lazy_refcounts", "off", false},
    {"refcount_bits", "16", false},
    {"nocow", NULL, false},
    {"extent_size_hint", NULL, true},
    {NULL, NULL, false},
};

static void print_formatting_line(const char *filename,
                                  const struct bi_create_opts *o,
                                  const struct bi_optlist *l)
{
    const struct line_key *keys =
        !strcmp(o->format, "qcow2") ? qcow2_keys : raw_keys;
    printf("Formatting '%s', fmt=%s", filename, o->format);
    for (const struct line_key *k = keys; k->key; k++) {
        const char *v = bi_optlist_get(l, k->key);
        char num[32];
        if (!strcmp(k->key, "size")) {
            snprintf(num, sizeof(num), "%llu", (unsigned long long)o->size);
            v = num;
        } else if (!strcmp(k->key, "backing_file") && o->backing_file) {
            v = o->backing_file;
        } else if (!strcmp(k->key, "backing_fmt") && o->backing_fmt) {
            v = o->backing_fmt;
        } else if (!strcmp(k->key, "preallocation") && !v &&
                   o->prealloc != BI_PREALLOC_OFF) {
            v = bi_prealloc_name(o->prealloc);
        } else if (v && k->is_size) {
            uint64_t s;
            if (bi_parse_size(v, &s) == 0) {
                snprintf(num, sizeof(num), "%llu", (unsigned long long)s);
                v = num;
            }
        }
        if (!v)
            v = k->def;
        if (v)
            printf(" %s=%s", k->key, v);
    }
    printf("\n");
    fflush(stdout);
}

/* The creation options each format takes, as qemu-img 7.2 lists them. */
static const char *const raw_create_keys[] = {"size", "preallocation", "nocow",
                                              "extent_size_hint", NULL};
static const char *const qcow2_create_keys[] = {"size",
                                                "compat",
                                                "backing_file",
                                                "backing_fmt",
                                                "data_file",
                                                "data_file_raw",
                                                "encryption",
                                                "encrypt.format",
                                                "encrypt.key-secret",
                                                "encrypt.cipher-alg",
                                                "encrypt.cipher-mode",
                                                "encrypt.ivgen-alg",
                                                "encrypt.ivgen-hash-alg",
                                                "encrypt.hash-alg",
                                                "encrypt.iter-time",
                                                "cluster_size",
                                                "extended_l2",
                                                "preallocation",
                                                "lazy_refcounts",
                                                "refcount_bits",
                                                "compression_type",
                                                "nocow",
                                                "extent_size_hint",
                                                NULL};

bool bi_create_option_known(const char *format, const char *key)
{
    const char *const *k = !strcmp(format, "qcow2") ? qcow2_create_keys
                           : !strcmp(format, "raw") ? raw_create_keys
                                                    : NULL;
    for (; k && *k; k++)
        if (!strcmp(*k, key))
            return true;
    return false;
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

int bi_create(const char *filename, const struct bi_create_opts *o,
              bi_error *err)
{
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
    bool is_raw = drv == &bi_drv_raw;
    if (is_raw && co.backing_fmt && !co.backing_file) {
        bi_error_set(err, 0,
                     "%s: Backing file format not supported for file "
                     "format 'raw'",
                     filename);
        bi_optlist_free(&l);
        return -ENOTSUP;
    }
    if (!o->quiet)
        print_formatting_line(filename, &co, &l);

    int ret = 0;
    const char *pre = bi_optlist_get(&l, "preallocation");
    if (pre && bi_prealloc_parse(pre, &co.prealloc) < 0) {
        if (is_raw)
            bi_error_set(err, 0, "invalid parameter value: %s", pre);
        else
            bi_error_set(err, 0,
                         "Parameter 'preallocation' does not accept value "
                         "'%s'",
                         pre);
        ret = -EINVAL;
    } else if (co.backing_fmt && !co.backing_file) {
        bi_error_set(err, 0,
                     "Backing format cannot be used without backing file");
        ret = -EINVAL;
    }
    /* Nodes are sized in whole 512-byte sectors, as in QEMU. */
    co.size = bi_align_up(co.size, 512);

    /* Protocol-level options go to the file, not to the format. */
    char **fmt_opts = bi_xzalloc((l.n + 1) * sizeof(char *));
    int nf = 0;
    /* QEMU gives new files a 1 MiB extent size hint (xfs) by default. */
    struct bi_file_create_hints hints = {.extent_size_hint = 1 << 20};
    for (int i = 0; ret == 0 && i < l.n; i++) {
        const char *k = l.v[i].key, *v = l.v[i].value;
        if (!strcmp(k, "nocow")) {
            hints.nocow = v && (!strcmp(v, "on") || !strcmp(v, "true"));
        } else if (!strcmp(k, "extent_size_hint")) {
            if (!v || bi_parse_size(v, &hints.extent_size_hint) < 0) {
                bi_error_set(err, 0,
                             "Parameter 'extent_size_hint' expects a size");
                ret = -EINVAL;
            }
        } else {
            fmt_opts[nf++] = escape_opt(k, v);
        }
    }
    co.options = (const char *const *)fmt_opts;
    if (ret == 0) {
        bool existed = access(filename, F_OK) == 0;
        bi_file_apply_create_hints(filename, &hints);
        ret = drv->create(filename, &co, err);
        if (ret < 0 && !existed)
            unlink(filename);
    }
    for (int i = 0; i < nf; i++)
        free(fmt_opts[i]);
    free(fmt_opts);
    if (ret < 0 && err && err->msg[0] &&
        strncmp(err->msg, filename, strlen(filename)) != 0)
        bi_error_prefix(err, "%s", filename);
    bi_optlist_free(&l);
    return ret;
}
