/* SPDX-License-Identifier: MIT */
/* Options of the http and https drivers: QEMU 7.2's curl driver's keys,
 * defaults, bounds and error words (checked with qemu-img info
 * --image-opts driver=http,...). */
#include "protocol/http/http.h"
#include "tap.h"

#include <errno.h>

/* Parses "k=v" strings (NULL-terminated) for proto; the error message, or
 * "" and the options in *c. */
static const char *conf(const char *proto, const char *const *opts,
                        struct http_conf *c)
{
    static char msg[1024];
    bi_error err;

    bi_error_init(&err);
    msg[0] = 0;
    if (bi_http_conf_parse(proto, opts, c, &err) < 0) {
        snprintf(msg, sizeof(msg), "%s", err.msg);
    }
    return msg;
}

/* The error for one open of http://h/x with one more option. */
static const char *with(const char *opt)
{
    const char *opts[] = {"url=http://h/x", opt, NULL};
    struct http_conf c;
    const char *m = conf("http", opts, &c);

    if (!m[0]) {
        bi_http_conf_free(&c);
    }
    return m;
}

static void test_defaults(void)
{
    const char *opts[] = {"url=http://h:8080/a,b=c.qcow2", NULL};
    struct http_conf c;

    is_str(conf("http", opts, &c), "", "a URL alone opens");
    is_str(c.url, "http://h:8080/a,b=c.qcow2", "commas and '=' kept");
    is_uint(c.readahead, 256u * 1024, "readahead 256 KiB");
    is_int(c.timeout, 5, "timeout 5 s");
    ok(c.sslverify, "sslverify on");
    ok(!c.name, "named by its URL");
    bi_http_conf_free(&c);

    const char *more[] = {
        "url=https://h/x", "readahead=64k", "timeout=0", "sslverify=off",
        "cookie=a=1; b=2", "username=u",    NULL};
    is_str(conf("https", more, &c), "", "every plain option");
    is_uint(c.readahead, 65536, "readahead takes a size");
    is_int(c.timeout, 0, "timeout 0: none");
    ok(!c.sslverify && c.name, "sslverify off: named by the options");
    is_int(bi_value_count(c.name), 5, "the driver and the four given");
    is_str(bi_value_get_string(bi_value_get(c.name, "sslverify")), "off",
           "as given");
    ok(!bi_value_get(c.name, "timeout"), "not timeout");
    is_str(c.cookie, "a=1; b=2", "cookie");
    is_str(c.username, "u", "username");
    bi_http_conf_free(&c);
}

static void test_errors(void)
{
    struct http_conf c;
    const char *none[] = {NULL};

    is_str(conf("http", none, &c), "curl block driver requires an 'url' option",
           "no url");
    is_str(with("readahead=1000"),
           "HTTP_READAHEAD_SIZE 1000 is not a multiple of 512",
           "readahead in sectors");
    is_str(with("timeout=10001"), "timeout parameter is too large or negative",
           "timeout bound");
    is_str(with("timeout=10000"), "", "timeout at the bound");
    is_str(with("timeout=x"), "Parameter 'timeout' expects a number",
           "timeout a number");
    is_str(with("sslverify=maybe"),
           "Parameter 'sslverify' expects 'on' or 'off'", "sslverify a bool");
    is_str(with("bogus=1"),
           "Block protocol 'http' doesn't support the option 'bogus'",
           "unknown key");
    is_str(with("password-secret=s0"), "No secret with id 's0'",
           "an undefined secret, in QEMU's words");
    is_str(with("proxy-password-secret=p0"), "No secret with id 'p0'",
           "proxy secret too");
    is_str(with("cookie-secret=c0"), "No secret with id 'c0'",
           "cookie secret too");
    const char *both[] = {"url=http://h/x", "cookie=a", "cookie-secret=c",
                          NULL};
    is_str(conf("http", both, &c),
           "curl driver cannot handle both cookie and cookie secret",
           "cookie twice");
    const char *tls[] = {"url=https://h/x", NULL};
    is_str(conf("http", tls, &c),
           "http curl driver cannot handle the URL 'https://h/x' (does not "
           "start with 'http://')",
           "the URL's scheme is the driver's");
}

static void test_parse_filename(void)
{
    struct bi_optlist l = {0};
    bi_error err;

    bi_error_init(&err);
    is_int(bi_http_parse_filename("http://h/a,b", &l, &err), 0,
           "a name is the url");
    is_str(bi_optlist_get(&l, "url"), "http://h/a,b", "as given");
    is_int(bi_http_parse_filename("http://h/y", &l, &err), -EINVAL,
           "url given twice");
    is_str(err.msg, "Option 'url' cannot be used with a file name", "refused");
    bi_optlist_free(&l);
}

int main(void)
{
    test_defaults();
    test_errors();
    test_parse_filename();
    return tap_done();
}
