/* SPDX-License-Identifier: MIT */
/* NBD file names: the forms QEMU 7.2 accepts (checked with qemu-img info
 * on each: what it opens, its canonical name, and which names it refuses
 * with "No valid URL specified" or "error parsing address"), plus nbds. */
#include "name_parse.h"
#include "protocol/nbd/nbd.h"
#include "tap.h"

#include <errno.h>

/* The options name makes as "k=v;k=v", or the error. */
static const char *parse(const char *name)
{
    return parse_with(bi_nbd_parse_filename, name);
}

/* The canonical name of what name opens. */
static const char *canon(const char *name)
{
    static char out[2048];
    struct bi_optlist l = {0};
    struct nbd_target t;
    bi_error err;
    char **v;

    bi_error_init(&err);
    if (bi_nbd_parse_filename(name, &l, &err) < 0) {
        return "parse error";
    }
    v = calloc((size_t)l.n + 1, sizeof(*v));
    for (int i = 0; i < l.n; i++) {
        v[i] = bi_xasprintf("%s=%s", l.v[i].key, l.v[i].value);
    }
    if (bi_nbd_target_parse((const char *const *)v, &t, &err) < 0) {
        snprintf(out, sizeof(out), "error: %s", err.msg);
    } else {
        char *c = bi_nbd_target_name(&t);
        snprintf(out, sizeof(out), "%s", c);
        free(c);
        bi_nbd_target_free(&t);
    }
    for (int i = 0; i < l.n; i++) {
        free(v[i]);
    }
    free(v);
    bi_optlist_free(&l);
    return out;
}

int main(void)
{
    is_str(parse("nbd://localhost/exp"),
           "server.type=inet;server.host=localhost;server.port=10809;"
           "export=exp",
           "nbd:// takes the default port");
    is_str(parse("nbd://127.0.0.1:10810"),
           "server.type=inet;server.host=127.0.0.1;server.port=10810",
           "no export: the default one");
    is_str(parse("nbd+tcp://[::1]:99/a%20b"),
           "server.type=inet;server.host=::1;server.port=99;export=a b",
           "IPv6 host, escaped export");
    is_str(parse("nbd+unix:///exp?socket=/run/s.sock"),
           "server.type=unix;server.path=/run/s.sock;export=exp",
           "nbd+unix with its socket");
    is_str(parse("nbd+unix://?socket=/s,x"),
           "server.type=unix;server.path=/s,x",
           "a comma in the socket path survives");
    is_str(parse("nbds+unix:///e?socket=/s&tls-creds=tls0"),
           "tls-creds=tls0;server.type=unix;server.path=/s;export=e;tls=on",
           "nbds carries TLS and may name credentials");
    is_str(parse("nbd:unix:/tmp/s.sock:exportname=exp"),
           "server.type=unix;server.path=/tmp/s.sock;export=exp",
           "legacy unix form");
    is_str(parse("nbd:localhost:1:exportname=foo:bar"),
           "server.type=inet;server.host=localhost;server.port=1;"
           "export=foo:bar",
           "legacy inet form; the export runs to the end");

    is_str(parse("nbd:localhost"), "error: error parsing address 'localhost'",
           "legacy inet needs a port");
    is_str(parse("nbd+unix:///exp"), "error: No valid URL specified",
           "unix without socket");
    is_str(parse("nbd://h/exp?socket=a"), "error: No valid URL specified",
           "inet with a query");
    is_str(parse("nbd+unix:///e?socket=a&foo=b"),
           "error: No valid URL specified", "unknown query parameter");
    is_str(parse("nbd://localhost:99999/x"), "error: No valid URL specified",
           "port out of range");
    is_str(parse("nbd://:10809/x"), "error: No valid URL specified",
           "empty host");
    is_str(parse("nbd:///x"), "error: No valid URL specified", "no host");
    is_str(parse("nbd+rdma://h/x"), "error: Unknown protocol 'nbd+rdma'",
           "unknown transport");
    is_str(parse("nbd+unix://?socket=/a&socket=/b"),
           "error: No valid URL specified", "repeated socket");

    {
        /* a name and options both saying where the server is */
        struct bi_optlist l = {0};
        bi_error err;
        bi_error_init(&err);
        bi_optlist_parse(&l, "export=x");
        is_int(bi_nbd_parse_filename("nbd://h/e", &l, &err), -EINVAL,
               "export given twice");
        is_str(err.msg, "Option 'export' cannot be used with a file name",
               "QEMU's words");
        bi_optlist_free(&l);
    }
    is_str(parse("nbd:"), "", "legacy without address: nothing");
    is_str(parse("nbd:unix:/s:exportname="), "",
           "legacy with an empty export name: nothing (QEMU drops all)");
    is_str(canon("nbd:"), "error: NBD server address missing",
           "then the open says so");

    /* QEMU's canonical names (qemu-img info's "image:" line) */
    is_str(canon("nbd:unix:/tmp/s.sock:exportname=exp"),
           "nbd+unix:///exp?socket=/tmp/s.sock", "unix name");
    is_str(canon("nbd+unix://?socket=/tmp/s.sock"),
           "nbd+unix://?socket=/tmp/s.sock", "unix, default export");
    is_str(canon("nbd:localhost:10811:exportname=ex"),
           "nbd://localhost:10811/ex", "inet name");
    is_str(canon("nbd://127.0.0.1"), "nbd://127.0.0.1:10809",
           "inet, default port and export");
    /* commas are part of names (found by tests/fuzz/fuzz_parse) */
    is_str(canon("nbd://a,,b,c:10809"), "nbd://a,,b,c:10809",
           "commas in a host stay");
    is_str(canon("nbd+unix:///e,x?socket=/tmp/s,,t"),
           "nbd+unix:///e,x?socket=/tmp/s,,t", "commas in export, socket");
    /* characters QEMU's URI parser refuses (tests/fuzz/fuzz_parse) */
    is_str(parse("nbd://h/a b"), "error: No valid URL specified",
           "space in the export");
    is_str(parse("nbd://s//[]:1"), "error: No valid URL specified",
           "brackets in the path");
    is_str(parse("nbd://h[/e"), "error: No valid URL specified",
           "bracket in the host");
    is_str(parse("nbd+unix:///e?socket=/a^b"), "error: No valid URL specified",
           "'^' in the query");
    is_str(canon("nbd://us:pw@h:12/e"), "nbd://h:12/e", "user info dropped");
    is_str(parse("nbd://a@b@h/e"), "error: No valid URL specified", "two '@'");
    is_str(canon("nbd://[::1]:12/e"), "nbd://[::1]:12/e", "IPv6 host");
    is_str(canon("nbds://h/e?tls-creds=nope"),
           "error: No TLS credentials with id 'nope'",
           "credentials must exist");
    return tap_done();
}
