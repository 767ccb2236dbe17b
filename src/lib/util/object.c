/* SPDX-License-Identifier: MIT */
/*
 * The --object registry: definitions are checked as QEMU 7.2 checks them
 * when it creates the object (types, properties, the credential files that
 * must be readable) and kept by id for the drivers (util/object.h).
 */
#include "util/object.h"
#include "blkimg/blkimg.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_OBJECTS 64

static struct bi_object objects[MAX_OBJECTS];
static int n_objects;

#define MAX_TYPES 4
static const struct bi_object_type *reg_types[MAX_TYPES];
static int n_types;

void bi_object_type_register(const struct bi_object_type *t)
{
    assert(n_types < MAX_TYPES);
    reg_types[n_types++] = t;
}

static const struct bi_object_type *registered_type(const char *name)
{
    for (int i = 0; i < n_types; i++)
        if (!strcmp(reg_types[i]->name, name))
            return reg_types[i];
    return NULL;
}

const struct bi_object *bi_object_find(const char *id)
{
    for (int i = 0; i < n_objects; i++) {
        if (!strcmp(objects[i].id, id)) {
            return &objects[i];
        }
    }
    return NULL;
}

const char *bi_object_prop(const struct bi_object *obj, const char *key)
{
    return bi_optlist_get(&obj->props, key);
}

int bi_parse_bool(const char *v)
{
    static const char *const yes[] = {"on", "yes", "true", "y"};
    static const char *const no[] = {"off", "no", "false", "n"};

    for (size_t i = 0; i < BI_ARRAY_SIZE(yes); i++) {
        if (!strcmp(v, yes[i])) {
            return 1;
        }
        if (!strcmp(v, no[i])) {
            return 0;
        }
    }
    return -EINVAL;
}

/* The other user-creatable object types of QEMU 7.2 (what qemu-img would
 * take but blkimg does not). */
static bool qemu_type(const char *type)
{
    static const char *const types[] = {
        "secret_keyring",
        "throttle-group",
        "iothread",
        "authz-simple",
        "authz-list",
        "authz-listfile",
        "authz-pam",
        "tls-creds-anon",
        "tls-cipher-suites",
        "memory-backend-file",
        "memory-backend-ram",
        "memory-backend-memfd",
        "main-loop",
        "input-barrier",
        "input-linux",
        "rng-random",
        "rng-egd",
        "rng-builtin",
        "colo-compare",
        "filter-buffer",
        "filter-dump",
        "filter-mirror",
        "filter-redirector",
        "filter-replay",
        "filter-rewriter",
        "cryptodev-backend-builtin",
        "dbus-vmstate",
        "can-bus",
        "pr-manager-helper",
    };
    for (size_t i = 0; i < BI_ARRAY_SIZE(types); i++) {
        if (!strcmp(types[i], type)) {
            return true;
        }
    }
    return false;
}

/* The properties each type takes (QEMU 7.2's tls-creds classes). */
static bool prop_known(const char *type, const char *key)
{
    static const char *const common[] = {"id",       "qom-type",    "dir",
                                         "endpoint", "verify-peer", "priority",
                                         "loaded",   NULL};
    static const char *const psk[] = {"username", NULL};
    static const char *const x509[] = {"sanity-check", "passwordid", NULL};
    const char *const *extra = strcmp(type, "tls-creds-psk") ? x509 : psk;

    for (const char *const *p = common; *p; p++) {
        if (!strcmp(*p, key)) {
            return true;
        }
    }
    for (const char *const *p = extra; *p; p++) {
        if (!strcmp(*p, key)) {
            return true;
        }
    }
    return false;
}

/* QEMU reads credential files when the object is created: a missing one
 * fails there. Returns 0 or -errno with err set. */
static int check_file(const char *dir, const char *name, bi_error *err)
{
    char *path = bi_xasprintf("%s/%s", dir, name);
    int ret = 0;

    if (access(path, R_OK) < 0) {
        ret = -errno;
        bi_error_set(err, errno, "Unable to access credentials %s", path);
    }
    free(path);
    return ret;
}

/* The files a credentials object needs for its endpoint. */
static int check_creds(const char *type, const struct bi_optlist *l,
                       bi_error *err)
{
    const char *dir = bi_optlist_get(l, "dir");
    const char *ep = bi_optlist_get(l, "endpoint");
    bool server = !ep || !strcmp(ep, "server");

    if (ep && strcmp(ep, "server") && strcmp(ep, "client")) {
        bi_error_set(err, 0, "Parameter 'endpoint' does not accept value '%s'",
                     ep);
        return -EINVAL;
    }
    const char *vp = bi_optlist_get(l, "verify-peer");
    if (vp && bi_parse_bool(vp) < 0) {
        bi_error_set(err, 0, "Parameter 'verify-peer' expects 'on' or 'off'");
        return -EINVAL;
    }
    if (!dir) {
        bi_error_set(err, 0, "Missing 'dir' property value");
        return -EINVAL;
    }
    if (!strcmp(type, "tls-creds-psk")) {
        return check_file(dir, "keys.psk", err);
    }
    int ret = check_file(dir, "ca-cert.pem", err);
    if (ret == 0 && server) {
        ret = check_file(dir, "server-cert.pem", err);
        if (ret == 0) {
            ret = check_file(dir, "server-key.pem", err);
        }
    }
    return ret;
}

int bi_object_add(const char *def, bi_error *err)
{
    struct bi_optlist l = {0};
    const char *type, *id;
    int ret = -EINVAL;

    if (bi_optlist_parse(&l, def) < 0 || l.n == 0) {
        /* never echo a secret's data */
        bi_error_set(err, 0, "Invalid object definition: %s",
                     strstr(def, "data=") ? "<redacted>" : def);
        goto fail;
    }
    /* "TYPE,k=v...": the first bare item is the type */
    type = l.v[0].value ? bi_optlist_get(&l, "qom-type") : l.v[0].key;
    if (!type) {
        bi_error_set(err, 0, "Parameter 'qom-type' is missing");
        goto fail;
    }
    const struct bi_object_type *rt = registered_type(type);
    if (!rt && strcmp(type, "tls-creds-psk") &&
        strcmp(type, "tls-creds-x509")) {
        if (qemu_type(type)) {
            bi_error_set(err, 0, "Object type '%s' is not supported by blkimg",
                         type);
            ret = -ENOTSUP;
        } else {
            bi_error_set(err, 0,
                         "Parameter 'qom-type' does not accept value '%s'",
                         type);
        }
        goto fail;
    }
    id = bi_optlist_get(&l, "id");
    if (!id) {
        bi_error_set(err, 0, "Parameter 'id' is missing");
        goto fail;
    }
    for (int i = l.v[0].value ? 0 : 1; i < l.n; i++) {
        const char *k = l.v[i].key;
        bool known =
            rt ? !strcmp(k, "id") || !strcmp(k, "qom-type") || rt->prop_known(k)
               : prop_known(type, k);
        if (!known) {
            bi_error_set(err, 0, "Parameter '%s' is unexpected", l.v[i].key);
            goto fail;
        }
    }
    if (bi_object_find(id)) {
        bi_error_set(err, 0,
                     "attempt to add duplicate property '%s' to object "
                     "(type 'container')",
                     id);
        goto fail;
    }
    if (n_objects == MAX_OBJECTS) {
        bi_error_set(err, 0, "Too many objects");
        ret = -ENOSPC;
        goto fail;
    }
    struct bi_object *o = &objects[n_objects];
    memset(o, 0, sizeof(*o));
    o->props = l;
    if (rt) {
        ret = rt->complete(o, err);
    } else {
        ret = check_creds(type, &l, err);
    }
    if (ret < 0) {
        memset(&o->props, 0, sizeof(o->props));
        goto fail;
    }
    o->type = bi_xstrdup(type);
    o->id = bi_xstrdup(id);
    n_objects++;
    return 0;
fail:
    /* secrets' data: no copy left behind */
    for (int i = 0; i < l.n; i++)
        if (l.v[i].value)
            explicit_bzero(l.v[i].value, strlen(l.v[i].value));
    bi_optlist_free(&l);
    return ret;
}
