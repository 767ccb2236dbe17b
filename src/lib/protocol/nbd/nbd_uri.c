/* SPDX-License-Identifier: MIT */
/*
 * NBD file names and options: the URL and legacy forms QEMU 7.2 accepts
 * (plus nbds:// with TLS), turned into the option keys --image-opts uses,
 * and those keys checked into a connection target. Pure string work: no
 * I/O, unit-tested (tests/unit/test_nbd_uri.c).
 */
#include "protocol/nbd/nbd.h"
#include "util/object.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put(struct bi_optlist *l, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Appends key=value to l (the list's own strings). */
static void put(struct bi_optlist *l, const char *key, const char *fmt, ...)
{
    va_list ap;
    char *v = NULL;
    char *item;

    va_start(ap, fmt);
    if (vasprintf(&v, fmt, ap) < 0) {
        abort();
    }
    va_end(ap);
    item = bi_xasprintf("%s=%s", key, v);
    if (bi_optlist_add(l, item) < 0) {
        abort(); /* the keys are ours, never empty */
    }
    free(item);
    free(v);
}

/* %XX decoding of a URL part of length len; NULL for a bad escape. */
static char *unescape(const char *s, size_t len)
{
    char *out = bi_xmalloc(len + 1);
    size_t n = 0;

    for (size_t i = 0; i < len; i++) {
        if (s[i] != '%') {
            out[n++] = s[i];
            continue;
        }
        if (i + 2 >= len || !isxdigit((unsigned char)s[i + 1]) ||
            !isxdigit((unsigned char)s[i + 2])) {
            free(out);
            return NULL;
        }
        char hex[3] = {s[i + 1], s[i + 2], 0};
        out[n++] = (char)strtol(hex, NULL, 16);
        i += 2;
    }
    out[n] = 0;
    return out;
}

static int bad_url(bi_error *err)
{
    bi_error_set(err, 0, "No valid URL specified");
    return -EINVAL;
}

/* The query parameters an nbds:// URL may carry, as blkimg's keys. */
static const char *tls_query_key(const char *name)
{
    static const char *const keys[] = {"tls-creds", "tls-certificates",
                                       "tls-psk-file", "tls-username"};
    for (size_t i = 0; i < BI_ARRAY_SIZE(keys); i++) {
        if (!strcmp(keys[i], name)) {
            return keys[i];
        }
    }
    return NULL;
}

/* Parses "a=b&c=d" of length len: "socket" into *socket (unix URLs), TLS
 * keys into l (nbds URLs). Anything else, or a repeated name, is an
 * invalid URL, as in QEMU. */
static int parse_query(const char *q, size_t len, bool tls, char **socket,
                       struct bi_optlist *l, bi_error *err)
{
    size_t pos = 0;

    while (pos < len) {
        size_t end = pos;
        while (end < len && q[end] != '&' && q[end] != ';') {
            end++;
        }
        const char *eq = memchr(q + pos, '=', end - pos);
        if (!eq) {
            return bad_url(err);
        }
        char *name = unescape(q + pos, (size_t)(eq - (q + pos)));
        char *val = unescape(eq + 1, (size_t)(q + end - (eq + 1)));
        const char *key = name && tls ? tls_query_key(name) : NULL;
        int ret = 0;
        if (!name || !val) {
            ret = bad_url(err);
        } else if (!strcmp(name, "socket") && socket && !*socket) {
            *socket = val;
            val = NULL;
        } else if (key && !bi_optlist_get(l, key)) {
            put(l, key, "%s", val);
        } else {
            ret = bad_url(err);
        }
        free(name);
        free(val);
        if (ret < 0) {
            return ret;
        }
        pos = end + 1;
    }
    return 0;
}

/* Splits "host[:port]" (host may be "[v6addr]") of an authority of length
 * len. Returns 0 or -EINVAL. */
static int split_authority(const char *a, size_t len, char **host, char **port)
{
    const char *colon;
    size_t hlen;

    if (len && a[0] == '[') {
        const char *close = memchr(a, ']', len);
        if (!close) {
            return -EINVAL;
        }
        *host = bi_xasprintf("%.*s", (int)(close - a - 1), a + 1);
        colon = close + 1 < a + len ? close + 1 : NULL;
        if (colon && *colon != ':') {
            free(*host);
            *host = NULL;
            return -EINVAL;
        }
    } else {
        colon = memchr(a, ':', len);
        hlen = colon ? (size_t)(colon - a) : len;
        *host = bi_xasprintf("%.*s", (int)hlen, a);
    }
    if (colon) {
        size_t plen = (size_t)(a + len - colon - 1);
        char *end;
        long v;
        *port = bi_xasprintf("%.*s", (int)plen, colon + 1);
        v = strtol(*port, &end, 10);
        if (!plen || *end || v < 0 || v > 65535) {
            free(*host);
            free(*port);
            *host = *port = NULL;
            return -EINVAL;
        }
    }
    return 0;
}

/* Whether the len bytes at s are all characters RFC 3986 lets a URL hold
 * outside its delimiters (unreserved, sub-delims, ':', '%' for escapes,
 * which unescape checks) or in extra. QEMU's URI parser refuses a URL
 * with any other character (space, '[', '^', non-ASCII...). */
static bool url_chars(const char *s, size_t len, const char *extra)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(c < 0x80 && isalnum(c)) && !strchr("-._~!$&'()*+,;=:%", c) &&
            !strchr(extra, c)) {
            return false;
        }
    }
    return true;
}

/* Checks the authority [a, a + len) as QEMU's URI parser does and drops
 * its user information ("user@", which the NBD driver ignores): *host_at
 * and *host_len give what is left, host[:port]. false if it is no URL
 * authority: characters outside url_chars, or brackets anywhere but
 * around an IPv6 host. */
static bool url_authority(const char *a, size_t len, const char **host_at,
                          size_t *host_len)
{
    const char *at = memchr(a, '@', len);

    if (at) {
        if (!url_chars(a, (size_t)(at - a), "")) {
            return false;
        }
        len -= (size_t)(at + 1 - a);
        a = at + 1;
    }
    const char *open = memchr(a, '[', len), *close = memchr(a, ']', len);
    if ((open && open != a) || (close && !open) ||
        !url_chars(a, len, open ? "[]" : "")) {
        return false;
    }
    *host_at = a;
    *host_len = len;
    return true;
}

/* nbd[s][+tcp|+unix]://[user@][host[:port]]/[export][?query] */
static int parse_url(const char *name, const char *scheme_end,
                     struct bi_optlist *l, bi_error *err)
{
    size_t slen = (size_t)(scheme_end - name);
    char scheme[16];
    const char *auth = scheme_end + 3, *path, *query;
    char *host = NULL, *port = NULL, *socket = NULL, *export = NULL;
    bool tls, is_unix;
    int ret = -EINVAL;

    if (slen >= sizeof(scheme)) {
        return bad_url(err);
    }
    memcpy(scheme, name, slen);
    scheme[slen] = 0;
    tls = !strncmp(scheme, "nbds", 4);
    const char *kind = scheme + (tls ? 4 : 3);
    if (!strcmp(kind, "") || !strcmp(kind, "+tcp")) {
        is_unix = false;
    } else if (!strcmp(kind, "+unix")) {
        is_unix = true;
    } else {
        bi_error_set(err, 0, "Unknown protocol '%s'", scheme);
        return -EINVAL;
    }
    path = auth + strcspn(auth, "/?#");
    query = strchr(path, '?');
    if (strchr(path, '#')) {
        return bad_url(err);
    }
    const char *hp;
    size_t hlen;
    if (!url_authority(auth, (size_t)(path - auth), &hp, &hlen) ||
        !url_chars(path, strlen(path), "@/?")) {
        return bad_url(err);
    }
    if (hlen && split_authority(hp, hlen, &host, &port) < 0) {
        return bad_url(err);
    }
    size_t plen = query ? (size_t)(query - path) : strlen(path);
    if (plen && path[0] == '/') {
        path++;
        plen--;
    }
    export = unescape(path, plen);
    if (!export) {
        goto bad;
    }
    if (query && parse_query(query + 1, strlen(query + 1), tls,
                             is_unix ? &socket : NULL, l, err) < 0) {
        goto out;
    }
    if (is_unix) {
        /* exactly the socket, and no server part */
        if (!socket || (host && host[0]) || port) {
            goto bad;
        }
        put(l, "server.type", "unix");
        put(l, "server.path", "%s", socket);
    } else {
        if (!host || !host[0]) {
            goto bad;
        }
        put(l, "server.type", "inet");
        put(l, "server.host", "%s", host);
        put(l, "server.port", "%s", port ? port : BI_NBD_DEFAULT_PORT);
    }
    if (export[0]) {
        put(l, "export", "%s", export);
    }
    if (tls) {
        put(l, "tls", "on");
    }
    ret = 0;
    goto out;
bad:
    ret = bad_url(err);
out:
    free(host);
    free(port);
    free(socket);
    free(export);
    return ret;
}

/* nbd:unix:PATH[:exportname=E] and nbd:HOST:PORT[:exportname=E] */
static int parse_legacy(const char *name, struct bi_optlist *l, bi_error *err)
{
    const char *rest = name + 4;
    const char *ex = strstr(rest, ":exportname=");
    size_t len = ex ? (size_t)(ex - rest) : strlen(rest);
    char *addr = bi_xasprintf("%.*s", (int)len, rest);
    int ret = 0;

    if (!addr[0] || (ex && !ex[strlen(":exportname=")])) {
        /* as QEMU: no address (an empty export name drops it too), and
         * the open says "NBD server address missing" */
        free(addr);
        return 0;
    }
    if (!strncmp(addr, "unix:", 5)) {
        put(l, "server.type", "unix");
        put(l, "server.path", "%s", addr + 5);
    } else {
        char *host = NULL, *port = NULL;
        if (split_authority(addr, len, &host, &port) < 0 || !port || !host[0]) {
            bi_error_set(err, 0, "error parsing address '%s'", addr);
            ret = -EINVAL;
        } else {
            put(l, "server.type", "inet");
            put(l, "server.host", "%s", host);
            put(l, "server.port", "%s", port);
        }
        free(host);
        free(port);
    }
    if (ret == 0 && ex) {
        put(l, "export", "%s", ex + strlen(":exportname="));
    }
    free(addr);
    return ret;
}

int bi_nbd_parse_filename(const char *filename, struct bi_optlist *l,
                          bi_error *err)
{
    const char *sep = strstr(filename, "://");

    /* the name says where the server is: options may not say it too */
    for (int i = 0; i < l->n; i++) {
        const char *k = l->v[i].key;
        if (!strcmp(k, "host") || !strcmp(k, "port") || !strcmp(k, "path") ||
            !strcmp(k, "export") || !strncmp(k, "server.", 7)) {
            bi_error_set(err, 0, "Option '%s' cannot be used with a file name",
                         k);
            return -EINVAL;
        }
    }

    if (sep && (size_t)(sep - filename) == strcspn(filename, ":")) {
        return parse_url(filename, sep, l, err);
    }
    if (!strncmp(filename, "nbd:", 4)) {
        return parse_legacy(filename, l, err);
    }
    bi_error_set(err, 0, "No valid URL specified");
    return -EINVAL;
}

/* ------------------------------------------------------------- targets */

/* The keys an open takes: QEMU 7.2's, then blkimg's (nbd.h). */
const struct bi_opt_desc bi_nbd_runtime_opts[] = {
    {"server.type", BI_OPT_STRING, "inet or unix", NULL, 0},
    {"server.host", BI_OPT_STRING, "TCP host to connect to", NULL, 0},
    {"server.port", BI_OPT_STRING, "TCP port to connect to", NULL, 0},
    {"server.path", BI_OPT_STRING, "Unix socket path to connect to", NULL, 0},
    {"host", BI_OPT_STRING, "TCP host to connect to (legacy)", NULL, 0},
    {"port", BI_OPT_STRING, "TCP port to connect to (legacy)", NULL, 0},
    {"path", BI_OPT_STRING, "Unix socket path (legacy)", NULL, 0},
    {"export", BI_OPT_STRING, "Name of the NBD export to open", NULL, 0},
    {"tls-creds", BI_OPT_STRING, "ID of the TLS credentials to use", NULL, 0},
    {"x-dirty-bitmap", BI_OPT_STRING,
     "experimental: expose named dirty bitmap in place of block status", NULL,
     0},
    {"tls", BI_OPT_BOOL, "TLS required (nbds://)", NULL, 0},
    {"tls-certificates", BI_OPT_STRING, "X.509 directory (nbds://)", NULL, 0},
    {"tls-psk-file", BI_OPT_STRING, "PSK file (nbds://)", NULL, 0},
    {"tls-username", BI_OPT_STRING, "PSK user (nbds://)", NULL, 0},
    {"multi-conn", BI_OPT_NUMBER,
     "Most connections where the server allows multi-conn", NULL, 0},
    {NULL, 0, NULL, NULL, 0},
};

static bool key_known(const char *k)
{
    for (const struct bi_opt_desc *d = bi_nbd_runtime_opts; d->name; d++) {
        if (!strcmp(d->name, k)) {
            return true;
        }
    }
    return false;
}

/* TLS from a tls-creds object (QEMU's checks and defaults). */
static int creds_from_object(const char *id, struct nbd_target *t,
                             bi_error *err)
{
    const struct bi_object *obj = bi_object_find(id);
    const char *ep, *dir, *vp;

    if (!obj || strncmp(obj->type, "tls-creds-", 10)) {
        bi_error_set(err, 0, "No TLS credentials with id '%s'", id);
        return -EINVAL;
    }
    ep = bi_object_prop(obj, "endpoint");
    if (!ep || strcmp(ep, "client")) {
        bi_error_set(err, 0, "Expected TLS credentials for a client endpoint");
        return -EINVAL;
    }
    dir = bi_object_prop(obj, "dir");
    t->tls = true;
    if (!strcmp(obj->type, "tls-creds-psk")) {
        const char *user = bi_object_prop(obj, "username");
        t->psk_file = bi_xasprintf("%s/keys.psk", dir);
        t->username = bi_xstrdup(user ? user : "qemu");
    } else {
        vp = bi_object_prop(obj, "verify-peer");
        t->certificates = bi_xstrdup(dir);
        t->verify_peer = !vp || bi_parse_bool(vp) == 1;
    }
    return 0;
}

/* The user must be in the PSK file (QEMU checks before connecting). */
static int check_psk_user(const struct nbd_target *t, bi_error *err)
{
    FILE *f = fopen(t->psk_file, "r");
    char line[1024];
    size_t ul = strlen(t->username);
    bool found = false;

    if (!f) {
        bi_error_set(err, errno, "Unable to access credentials %s",
                     t->psk_file);
        return -errno;
    }
    while (!found && fgets(line, sizeof(line), f)) {
        found = !strncmp(line, t->username, ul) && line[ul] == ':';
    }
    fclose(f);
    if (!found) {
        bi_error_set(err, 0, "Username %s not found in PSK file %s",
                     t->username, t->psk_file);
        return -ENOENT;
    }
    return 0;
}

/* Whether l has any server.* key. */
static bool has_server_key(const struct bi_optlist *l)
{
    for (int i = 0; i < l->n; i++) {
        if (!strncmp(l->v[i].key, "server.", 7)) {
            return true;
        }
    }
    return false;
}

/* QEMU's legacy keys: path=, or host= [port=] (default 10809). */
static int target_legacy(const struct bi_optlist *l, struct nbd_target *t,
                         bi_error *err)
{
    const char *path = bi_optlist_get(l, "path");
    const char *host = bi_optlist_get(l, "host");
    const char *port = bi_optlist_get(l, "port");

    if (has_server_key(l)) {
        bi_error_set(err, 0,
                     "Cannot use 'server' and path/host/port at "
                     "the same time");
        return -EINVAL;
    }
    if (path && host) {
        bi_error_set(err, 0, "path and host may not be used at the same time");
        return -EINVAL;
    }
    if (path && port) {
        bi_error_set(err, 0, "port may not be used without host");
        return -EINVAL;
    }
    if (!path && !host) {
        bi_error_set(err, 0, "NBD server address missing");
        return -EINVAL;
    }
    if (path) {
        t->is_unix = true;
        t->path = bi_xstrdup(path);
    } else {
        t->host = bi_xstrdup(host);
        t->port = bi_xstrdup(port ? port : BI_NBD_DEFAULT_PORT);
    }
    return 0;
}

/* Where the server is: server.* (QEMU's SocketAddress) or the legacy
 * keys. 0 or -EINVAL with QEMU's words. */
static int target_server(const struct bi_optlist *l, struct nbd_target *t,
                         bi_error *err)
{
    const char *type = bi_optlist_get(l, "server.type");
    const char *v;

    if (bi_optlist_get(l, "path") || bi_optlist_get(l, "host") ||
        bi_optlist_get(l, "port")) {
        return target_legacy(l, t, err);
    }
    if (!type) {
        bi_error_set(err, 0,
                     has_server_key(l) ? "Parameter 'server.type' is missing"
                                       : "NBD server address missing");
        return -EINVAL;
    }
    if (!strcmp(type, "unix")) {
        t->is_unix = true;
        v = bi_optlist_get(l, "server.path");
        if (!v) {
            bi_error_set(err, 0, "Parameter 'server.path' is missing");
            return -EINVAL;
        }
        t->path = bi_xstrdup(v);
    } else if (!strcmp(type, "inet")) {
        v = bi_optlist_get(l, "server.host");
        if (!v) {
            bi_error_set(err, 0, "Parameter 'server.host' is missing");
            return -EINVAL;
        }
        t->host = bi_xstrdup(v);
        v = bi_optlist_get(l, "server.port");
        if (!v) {
            bi_error_set(err, 0, "Parameter 'server.port' is missing");
            return -EINVAL;
        }
        t->port = bi_xstrdup(v);
    } else {
        bi_error_set(err, 0,
                     "Parameter 'server.type' does not accept value "
                     "'%s'",
                     type);
        return -EINVAL;
    }
    return 0;
}

static int target_tls(const struct bi_optlist *l, struct nbd_target *t,
                      bi_error *err)
{
    const char *creds = bi_optlist_get(l, "tls-creds");
    const char *v = bi_optlist_get(l, "tls");

    if (v && bi_parse_bool(v) < 0) {
        bi_error_set(err, 0, "Parameter 'tls' expects 'on' or 'off'");
        return -EINVAL;
    }
    t->tls = v && bi_parse_bool(v) == 1;
    t->verify_peer = true;
    if (creds) {
        int ret = creds_from_object(creds, t, err);
        if (ret < 0) {
            return ret;
        }
    } else {
        if ((v = bi_optlist_get(l, "tls-psk-file"))) {
            t->psk_file = bi_xstrdup(v);
        }
        if ((v = bi_optlist_get(l, "tls-certificates"))) {
            t->certificates = bi_xstrdup(v);
        }
        v = bi_optlist_get(l, "tls-username");
        t->username = bi_xstrdup(v ? v : "qemu");
        t->tls = t->tls || t->psk_file || t->certificates;
    }
    if (t->psk_file) {
        return check_psk_user(t, err);
    }
    if (t->tls && t->is_unix && t->verify_peer) {
        /* X.509 checks the server's name; a socket path has none (QEMU
         * wants tls-hostname, which libnbd 1.14 cannot take) */
        bi_error_set(err, 0, "No hostname for certificate validation");
        return -EINVAL;
    }
    return 0;
}

int bi_nbd_target_parse(const char *const *opts, struct nbd_target *t,
                        bi_error *err)
{
    struct bi_optlist l = {0};
    const char *v;
    int ret = 0;

    memset(t, 0, sizeof(*t));
    for (const char *const *p = opts; p && *p && ret == 0; p++) {
        ret = bi_optlist_add(&l, *p); /* one key=value each, as given */
    }
    for (int i = 0; ret == 0 && i < l.n; i++) {
        if (!key_known(l.v[i].key)) {
            bi_error_set(err, 0,
                         "Block protocol 'nbd' doesn't support the option "
                         "'%s'",
                         l.v[i].key);
            ret = -EINVAL;
        }
    }
    if (ret == 0) {
        ret = target_server(&l, t, err);
    }
    if (ret == 0) {
        v = bi_optlist_get(&l, "export");
        t->export = bi_xstrdup(v ? v : "");
        v = bi_optlist_get(&l, "x-dirty-bitmap");
        t->bitmap = v ? bi_xstrdup(v) : NULL;
        v = bi_optlist_get(&l, "multi-conn");
        t->multi_conn = v ? atoi(v) : 4;
        if (t->multi_conn < 1 || t->multi_conn > 16) {
            bi_error_set(err, 0,
                         "Parameter 'multi-conn' expects a number "
                         "from 1 to 16");
            ret = -EINVAL;
        }
    }
    if (ret == 0) {
        ret = target_tls(&l, t, err);
    }
    bi_optlist_free(&l);
    if (ret < 0) {
        bi_nbd_target_free(t);
    }
    return ret;
}

void bi_nbd_target_free(struct nbd_target *t)
{
    free(t->host);
    free(t->port);
    free(t->path);
    free(t->export);
    free(t->bitmap);
    free(t->certificates);
    free(t->psk_file);
    free(t->username);
    memset(t, 0, sizeof(*t));
}

char *bi_nbd_target_name(const struct nbd_target *t)
{
    const char *ex = t->export ? t->export : "";

    if (t->is_unix) {
        return bi_xasprintf("nbd+unix://%s%s?socket=%s", ex[0] ? "/" : "", ex,
                            t->path);
    }
    bool v6 = strchr(t->host, ':') != NULL;
    return bi_xasprintf("nbd://%s%s%s:%s%s%s", v6 ? "[" : "", t->host,
                        v6 ? "]" : "", t->port, ex[0] ? "/" : "", ex);
}
