/* SPDX-License-Identifier: MIT */
/*
 * Options of the http and https drivers: QEMU 7.2's curl driver's keys,
 * checked in its order and refused in its words. Pure string work.
 */
#include "crypto/secret.h"
#include "protocol/http/http.h"
#include "util/object.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* QEMU's runtime_opts of the curl driver, in its order. */
const struct bi_opt_desc bi_http_runtime_opts[] = {
    {"url", BI_OPT_STRING, "URL to open", NULL, 0},
    {"readahead", BI_OPT_SIZE, "Readahead size", NULL, 0},
    {"sslverify", BI_OPT_BOOL, "Verify SSL certificate", NULL, 0},
    {"timeout", BI_OPT_NUMBER, "Curl timeout", NULL, 0},
    {"cookie", BI_OPT_STRING,
     "Pass the cookie or list of cookies with each request", NULL, 0},
    {"cookie-secret", BI_OPT_STRING,
     "ID of secret used as cookie passed with each request", NULL, 0},
    {"username", BI_OPT_STRING, "Username for HTTP auth", NULL, 0},
    {"password-secret", BI_OPT_STRING,
     "ID of secret used as password for HTTP auth", NULL, 0},
    {"proxy-username", BI_OPT_STRING, "Username for HTTP proxy auth", NULL, 0},
    {"proxy-password-secret", BI_OPT_STRING,
     "ID of secret used as password for HTTP proxy auth", NULL, 0},
    {NULL, 0, NULL, NULL, 0},
};

/* Appends key=value to l as it is (no comma escapes: one option each). */
static void push(struct bi_optlist *l, const char *key, size_t klen,
                 const char *value)
{
    l->v = realloc(l->v, sizeof(*l->v) * (size_t)(l->n + 1));
    if (!l->v) {
        abort();
    }
    l->v[l->n].key = bi_xasprintf("%.*s", (int)klen, key);
    l->v[l->n].value = bi_xstrdup(value);
    l->n++;
}

int bi_http_parse_filename(const char *filename, struct bi_optlist *l,
                           bi_error *err)
{
    if (bi_optlist_get(l, "url")) {
        bi_error_set(err, 0, "Option 'url' cannot be used with a file name");
        return -EINVAL;
    }
    push(l, "url", 3, filename);
    return 0;
}

static int check_keys(const char *proto, const struct bi_optlist *l,
                      bi_error *err)
{
    for (int i = 0; i < l->n; i++) {
        if (!bi_opt_lookup(bi_http_runtime_opts, l->v[i].key)) {
            bi_error_set(err, 0,
                         "Block protocol '%s' doesn't support the option '%s'",
                         proto, l->v[i].key);
            return -EINVAL;
        }
    }
    return 0;
}

/* readahead, timeout, sslverify: parsed and bounded as QEMU does. */
static int parse_numbers(const struct bi_optlist *l, struct http_conf *c,
                         bi_error *err)
{
    const char *v;
    char *end;

    c->readahead = BI_HTTP_READAHEAD_DEFAULT;
    if ((v = bi_optlist_get(l, "readahead")) &&
        bi_parse_size(v, &c->readahead) < 0) {
        bi_error_set(err, 0,
                     "Parameter 'readahead' expects a non-negative number "
                     "below 2^64");
        return -EINVAL;
    }
    if (c->readahead & 0x1ff) {
        bi_error_set(err, 0,
                     "HTTP_READAHEAD_SIZE %" PRIu64 " is not a multiple of 512",
                     c->readahead);
        return -EINVAL;
    }
    c->timeout = BI_HTTP_TIMEOUT_DEFAULT;
    if ((v = bi_optlist_get(l, "timeout"))) {
        unsigned long long t = strtoull(v, &end, 0);
        if (!*v || *end || v[0] == '-') {
            bi_error_set(err, 0, "Parameter 'timeout' expects a number");
            return -EINVAL;
        }
        if (t > BI_HTTP_TIMEOUT_MAX) {
            bi_error_set(err, 0, "timeout parameter is too large or negative");
            return -EINVAL;
        }
        c->timeout = (long)t;
    }
    c->sslverify = true;
    if ((v = bi_optlist_get(l, "sslverify"))) {
        int b = bi_parse_bool(v);
        if (b < 0) {
            bi_error_set(err, 0, "Parameter 'sslverify' expects 'on' or 'off'");
            return -EINVAL;
        }
        c->sslverify = b == 1;
    }
    return 0;
}

/* url (of this driver's scheme), cookie and the credentials. */
static int parse_strings(const char *proto, const struct bi_optlist *l,
                         struct http_conf *c, bi_error *err)
{
    const char *cookie = bi_optlist_get(l, "cookie");
    const char *v = bi_optlist_get(l, "cookie-secret");
    size_t pl = strlen(proto);

    if (cookie && v) {
        bi_error_set(err, 0,
                     "curl driver cannot handle both cookie and cookie secret");
        return -EINVAL;
    }
    if (v && bi_secret_lookup_utf8(v, &c->cookie_secret, err) < 0) {
        return -EINVAL;
    }
    v = bi_optlist_get(l, "url");
    if (!v) {
        bi_error_set(err, 0, "curl block driver requires an 'url' option");
        return -EINVAL;
    }
    if (strncmp(v, proto, pl) || strncmp(v + pl, "://", 3)) {
        bi_error_set(err, 0,
                     "%s curl driver cannot handle the URL '%s' (does not "
                     "start with '%s://')",
                     proto, v, proto);
        return -EINVAL;
    }
    c->url = bi_xstrdup(v);
    c->cookie = cookie ? bi_xstrdup(cookie) : NULL;
    if ((v = bi_optlist_get(l, "username"))) {
        c->username = bi_xstrdup(v);
    }
    if ((v = bi_optlist_get(l, "password-secret")) &&
        bi_secret_lookup_utf8(v, &c->password, err) < 0) {
        return -EINVAL;
    }
    if ((v = bi_optlist_get(l, "proxy-username"))) {
        c->proxy_username = bi_xstrdup(v);
    }
    if ((v = bi_optlist_get(l, "proxy-password-secret")) &&
        bi_secret_lookup_utf8(v, &c->proxy_password, err) < 0) {
        return -EINVAL;
    }
    return 0;
}

/* QEMU's name of a node opened with options that change what is read:
 * the driver and those of its "strong" options that were given, as given
 * (readahead and timeout do not count). */
static bi_value *name_opts(const char *proto, const struct bi_optlist *l)
{
    static const char *const strong[] = {"url",
                                         "sslverify",
                                         "cookie",
                                         "cookie-secret",
                                         "username",
                                         "password-secret",
                                         "proxy-username",
                                         "proxy-password-secret"};
    bi_value *v = bi_value_object();

    bi_value_set_string(v, "driver", proto);
    for (size_t i = 0; i < BI_ARRAY_SIZE(strong); i++) {
        const char *s = bi_optlist_get(l, strong[i]);
        if (s) {
            bi_value_set_string(v, strong[i], s);
        }
    }
    return v;
}

int bi_http_conf_parse(const char *proto, const char *const *opts,
                       struct http_conf *c, bi_error *err)
{
    struct bi_optlist l = {0};
    int ret = 0;

    memset(c, 0, sizeof(*c));
    /* one key=value a string: a URL may hold commas and '=' */
    for (const char *const *p = opts; p && *p; p++) {
        const char *eq = strchr(*p, '=');
        push(&l, *p, eq ? (size_t)(eq - *p) : strlen(*p), eq ? eq + 1 : "on");
    }
    ret = check_keys(proto, &l, err);
    if (ret == 0) {
        ret = parse_numbers(&l, c, err);
    }
    if (ret == 0) {
        ret = parse_strings(proto, &l, c, err);
    }
    if (ret == 0 &&
        (!c->sslverify || c->cookie || c->cookie_secret || c->username ||
         c->password || c->proxy_username || c->proxy_password)) {
        c->name = name_opts(proto, &l);
    }
    bi_optlist_free(&l);
    if (ret < 0) {
        bi_http_conf_free(c);
    }
    return ret;
}

void bi_http_conf_free(struct http_conf *c)
{
    free(c->url);
    free(c->cookie);
    free(c->username);
    free(c->proxy_username);
    bi_secret_free(c->cookie_secret);
    bi_secret_free(c->password);
    bi_secret_free(c->proxy_password);
    bi_value_free(c->name);
    memset(c, 0, sizeof(*c));
}
