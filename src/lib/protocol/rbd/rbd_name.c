/* SPDX-License-Identifier: MIT */
/*
 * RBD file names and options as QEMU 7.2 reads them, and the connection to
 * the cluster: rbd:pool[/namespace]/image[@snap][:name=value...], where
 * "\" escapes the next character, "id" names the user, "conf" the
 * configuration file, and every other pair goes to librados as
 * configuration (mon_host, key, auth_supported, rbd_cache, ...).
 */
#include "crypto/secret.h"
#include "protocol/rbd/rbd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends key=value to l as it is (no option syntax to escape for). */
static void put(struct bi_optlist *l, const char *key, const char *v)
{
    struct bi_opt *nv = realloc(l->v, sizeof(*nv) * (size_t)(l->n + 1));

    if (!nv) {
        abort();
    }
    l->v = nv;
    l->v[l->n].key = bi_xstrdup(key);
    l->v[l->n].value = bi_xstrdup(v);
    l->n++;
}

/* Cuts s at the first delim not escaped by "\" (writing a NUL there):
 * *rest is what follows, or NULL when there is no delim. Returns s. */
static char *next_tok(char *s, char delim, char **rest)
{
    *rest = NULL;
    for (char *p = s; *p; p++) {
        if (*p == '\\' && p[1]) {
            p++;
        } else if (*p == delim) {
            *p = 0;
            *rest = p + 1;
            break;
        }
    }
    return s;
}

/* The first c of s not escaped by "\", or NULL. */
static char *find_unescaped(char *s, char c)
{
    for (char *p = s; *p; p++) {
        if (*p == c) {
            return p;
        }
        if (*p == '\\' && p[1]) {
            p++;
        }
    }
    return NULL;
}

/* Removes the escaping "\" of s, in place. Returns s. */
static char *unescape(char *s)
{
    char *w = s;

    for (char *p = s; *p; p++) {
        if (*p == '\\' && p[1]) {
            p++;
        }
        *w++ = *p;
    }
    *w = 0;
    return s;
}

/* The pairs of an rbd: name: "id" and "conf" become options, the rest
 * is kept (escaped as given) in "=keyvalue-pairs". */
static int parse_pairs(char *p, struct bi_optlist *l, bi_error *err)
{
    char *kept = bi_xstrdup("");

    while (p) {
        char *start = p, *name = next_tok(p, '=', &p), *value;
        if (!p) {
            bi_error_set(err, 0, "conf option %s has no value", unescape(name));
            free(kept);
            return -EINVAL;
        }
        value = next_tok(p, ':', &p);
        if (!strcmp(name, "id") || !strcmp(name, "conf")) {
            put(l, !strcmp(name, "id") ? "user" : "conf", unescape(value));
            continue;
        }
        char *k =
            bi_xasprintf("%s%s%s=%s", kept, kept[0] ? ":" : "", start, value);
        free(kept);
        kept = k;
    }
    if (kept[0]) {
        put(l, "=keyvalue-pairs", kept);
    }
    free(kept);
    return 0;
}

int bi_rbd_parse_filename(const char *filename, struct bi_optlist *l,
                          bi_error *err)
{
    char *buf, *p, *image, *ns = NULL;
    int ret = 0;

    if (strncmp(filename, "rbd:", 4)) {
        bi_error_set(err, 0, "File name must start with 'rbd:'");
        return -EINVAL;
    }
    for (int i = 0; i < l->n; i++) {
        if (strcmp(l->v[i].key, "driver")) {
            bi_error_set(err, 0, "Option '%s' cannot be used with a file name",
                         l->v[i].key);
            return -EINVAL;
        }
    }
    buf = bi_xstrdup(filename + 4);
    char *pool = next_tok(buf, '/', &p);
    if (!p) {
        bi_error_set(err, 0, "Pool name is required");
        free(buf);
        return -EINVAL;
    }
    put(l, "pool", unescape(pool));
    bool has_snap = find_unescaped(p, '@') != NULL;
    image = next_tok(p, has_snap ? '@' : ':', &p);
    if (has_snap) {
        char *snap = next_tok(p, ':', &p);
        put(l, "snapshot", unescape(snap));
    }
    if (find_unescaped(image, '/')) {
        ns = next_tok(image, '/', &image);
    }
    put(l, "namespace", ns ? unescape(ns) : "");
    put(l, "image", unescape(image));
    if (p) {
        ret = parse_pairs(p, l, err);
    }
    free(buf);
    return ret;
}

/* ------------------------------------------------------------- targets */

const struct bi_opt_desc bi_rbd_runtime_opts[] = {
    {"pool", BI_OPT_STRING, "Rados pool name", NULL, 0},
    {"namespace", BI_OPT_STRING, "Rados namespace name in the pool", NULL, 0},
    {"image", BI_OPT_STRING, "Image name in the pool", NULL, 0},
    {"snapshot", BI_OPT_STRING, "Ceph snapshot name", NULL, 0},
    {"conf", BI_OPT_STRING, "Rados config file location", NULL, 0},
    {"user", BI_OPT_STRING, "Rados id name", NULL, 0},
    {"key-secret", BI_OPT_STRING, "ID of secret providing the password", NULL,
     0},
    {"=keyvalue-pairs", BI_OPT_STRING, "Legacy rados key/value option pairs",
     NULL, 0},
    {NULL, 0, NULL, NULL, 0},
};

static char *dup_opt(const struct bi_optlist *l, const char *key)
{
    const char *v = bi_optlist_get(l, key);
    return v ? bi_xstrdup(v) : NULL;
}

/* Checks the keys of l: known ones, what must be there. */
static int check_keys(const struct bi_optlist *l, bi_error *err)
{
    for (int i = 0; i < l->n; i++) {
        if (!bi_opt_lookup(bi_rbd_runtime_opts, l->v[i].key)) {
            bi_error_set(err, 0,
                         "Block protocol 'rbd' doesn't support the option "
                         "'%s'",
                         l->v[i].key);
            return -EINVAL;
        }
    }
    static const char *const needed[] = {"pool", "image"};
    for (size_t i = 0; i < BI_ARRAY_SIZE(needed); i++) {
        if (!bi_optlist_get(l, needed[i])) {
            bi_error_set(err, 0, "Parameter '%s' is missing", needed[i]);
            return -EINVAL;
        }
    }
    return 0;
}

int bi_rbd_target_parse(const char *const *opts, struct rbd_target *t,
                        bi_error *err)
{
    struct bi_optlist l = {0};
    int ret = 0;

    memset(t, 0, sizeof(*t));
    for (const char *const *p = opts; p && *p && ret == 0; p++) {
        /* "=keyvalue-pairs=..." has its own '=' first */
        if (!strncmp(*p, "=keyvalue-pairs=", 16)) {
            put(&l, "=keyvalue-pairs", *p + 16);
        } else if (bi_optlist_parse(&l, *p) < 0) {
            bi_error_set(err, 0, "Invalid parameter '%s'", *p);
            ret = -EINVAL;
        }
    }
    if (ret == 0) {
        ret = check_keys(&l, err);
    }
    if (ret == 0) {
        t->pool = dup_opt(&l, "pool");
        t->ns = dup_opt(&l, "namespace");
        t->image = dup_opt(&l, "image");
        t->snap = dup_opt(&l, "snapshot");
        t->conf = dup_opt(&l, "conf");
        t->user = dup_opt(&l, "user");
        t->pairs = dup_opt(&l, "=keyvalue-pairs");
        const char *secret = bi_optlist_get(&l, "key-secret");
        if (secret) {
            /* looked up before any connection, as the other checks */
            ret = bi_secret_lookup_base64(secret, &t->key, err);
        }
    }
    bi_optlist_free(&l);
    return ret;
}

void bi_rbd_target_free(struct rbd_target *t)
{
    free(t->pool);
    free(t->ns);
    free(t->image);
    free(t->snap);
    free(t->conf);
    free(t->user);
    free(t->pairs);
    bi_secret_free(t->key);
    memset(t, 0, sizeof(*t));
}

char *bi_rbd_target_name(const struct rbd_target *t)
{
    bi_value *o = bi_value_object();
    const char *keys[] = {"pool", "image",     "snapshot",
                          "conf", "namespace", "user"};
    const char *vals[] = {t->pool, t->image, t->snap, t->conf, t->ns, t->user};
    char *text = NULL;
    size_t len = 0;
    FILE *f;

    for (size_t i = 0; i < BI_ARRAY_SIZE(keys); i++) {
        if (vals[i]) {
            bi_value_set_string(o, keys[i], vals[i]);
        }
    }
    bi_value_set_string(o, "driver", "rbd");
    f = open_memstream(&text, &len);
    if (!f) {
        abort();
    }
    fputs("json:", f);
    bi_value_print_json(f, o, BI_VALUE_QDICT_ORDER);
    fclose(f);
    bi_value_free(o);
    return text;
}

/* ---------------------------------------------------------- connecting */

/* Hands the "=keyvalue-pairs" of an rbd: name to librados. */
static int set_pairs(rados_t c, const char *pairs, bi_error *err)
{
    char *buf = bi_xstrdup(pairs), *p = buf;
    int ret = 0;

    while (p && ret == 0) {
        char *name = next_tok(p, '=', &p);
        char *value = p ? next_tok(p, ':', &p) : "";
        unescape(name);
        unescape(value);
        ret = bi_rbd.rados_conf_set(c, name, value);
        if (ret < 0) {
            bi_error_set(err, -ret, "invalid conf option %s", name);
        }
    }
    free(buf);
    return ret;
}

/* Creates the cluster handle configured as QEMU does: the configuration
 * file, then the pairs, then the cache mode, then the key. */
static int configure(const struct rbd_target *t, bool no_cache, rados_t c,
                     bi_error *err)
{
    int ret;

    /* before the file, which may set its own */
    (void)bi_rbd.rados_conf_set(c, "client_mount_timeout",
                                BI_RBD_MOUNT_TIMEOUT);
    ret = bi_rbd.rados_conf_read_file(c, t->conf);
    if (ret < 0 && t->conf) {
        bi_error_set(err, -ret, "error reading conf file %s", t->conf);
        return ret;
    }
    if (t->pairs && (ret = set_pairs(c, t->pairs, err)) < 0) {
        return ret;
    }
    (void)bi_rbd.rados_conf_set(c, "rbd_cache", no_cache ? "false" : "true");
    if (t->key && (ret = bi_rbd.rados_conf_set(c, "key", t->key)) < 0) {
        bi_error_set(err, -ret, "Could not set 'key'");
        return ret;
    }
    return 0;
}

int bi_rbd_connect(const struct rbd_target *t, bool no_cache, rados_t *cluster,
                   rados_ioctx_t *io, bi_error *err)
{
    rados_t c;
    int ret = bi_rbd_load(err);
    if (ret < 0) {
        return ret;
    }
    ret = bi_rbd.rados_create(&c, t->user);

    if (ret < 0) {
        bi_error_set(err, -ret, "error initializing");
        return ret;
    }
    ret = configure(t, no_cache, c, err);
    if (ret == 0 && (ret = bi_rbd.rados_connect(c)) < 0) {
        bi_error_set(err, -ret, "error connecting");
    }
    if (ret == 0 && (ret = bi_rbd.rados_ioctx_create(c, t->pool, io)) < 0) {
        bi_error_set(err, -ret, "error opening pool %s", t->pool);
    }
    if (ret < 0) {
        bi_rbd.rados_shutdown(c);
        return ret;
    }
    bi_rbd.rados_ioctx_set_namespace(*io, t->ns ? t->ns : "");
    *cluster = c;
    return 0;
}
