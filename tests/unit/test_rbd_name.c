/* SPDX-License-Identifier: MIT */
/* RBD file names and options: the forms QEMU 7.2 reads (checked with
 * qemu-img info on each against a real cluster: what it opens, the json:
 * name it shows, the error lines of the names it refuses). */
#include "name_parse.h"
#include "protocol/rbd/rbd.h"
#include "tap.h"

#include <errno.h>

/* The options name makes as "k=v;k=v", or the error. */
static const char *parse(const char *name)
{
    return parse_with(bi_rbd_parse_filename, name);
}

/* The json: name of what the options opts open, or the error. */
static const char *canon(const char *const *opts)
{
    static char out[2048];
    struct rbd_target t;
    bi_error err;

    bi_error_init(&err);
    if (bi_rbd_target_parse(opts, &t, &err) < 0) {
        snprintf(out, sizeof(out), "error: %s", err.msg);
    } else {
        char *c = bi_rbd_target_name(&t);
        snprintf(out, sizeof(out), "%s", c);
        free(c);
    }
    bi_rbd_target_free(&t);
    return out;
}

int main(void)
{
    is_str(parse("rbd:rbd/q1"), "pool=rbd;namespace=;image=q1", "plain");
    is_str(parse("rbd:rbd/ns1/n1@s:id=admin:conf=/c:rbd_cache=false"),
           "pool=rbd;snapshot=s;namespace=ns1;image=n1;user=admin;conf=/c;"
           "=keyvalue-pairs=rbd_cache=false",
           "namespace, snapshot, id, conf and a pair");
    is_str(parse("rbd:p/a\\:b:mon_host=1.2.3.4\\:6789:key=K"),
           "pool=p;namespace=;image=a:b;"
           "=keyvalue-pairs=mon_host=1.2.3.4\\:6789:key=K",
           "escapes (kept in the pairs for librados' parse)");
    /* an escaped '@' or '/' is part of the image name */
    is_str(parse("rbd:p/a\\@b\\/c:id=x"),
           "pool=p;namespace=;image=a@b/c;user=x", "escaped @ and /");
    is_str(parse("rbd:rbd"), "error: Pool name is required", "no pool");
    is_str(parse("rbd:rbd/x:novalue"),
           "error: conf option novalue has no value", "pair without value");
    {
        const char *o[] = {"pool=rbd",   "image=q1",   "snapshot=s1", "conf=/c",
                           "namespace=", "user=admin", NULL};
        is_str(canon(o),
               "json:{\"pool\": \"rbd\", \"image\": \"q1\", \"conf\": "
               "\"/c\", \"snapshot\": \"s1\", \"driver\": \"rbd\", "
               "\"namespace\": \"\", \"user\": \"admin\"}",
               "QEMU's json: name, its QDict order");
    }
    {
        const char *o[] = {"pool=rbd", "image=q1", NULL};
        is_str(canon(o),
               "json:{\"pool\": \"rbd\", \"image\": \"q1\", \"driver\": "
               "\"rbd\"}",
               "image options without a namespace");
    }
    {
        const char *o[] = {"pool=rbd", NULL};
        is_str(canon(o), "error: Parameter 'image' is missing", "no image");
    }
    {
        const char *o[] = {"pool=rbd", "image=x", "key-secret=sec0", NULL};
        is_str(canon(o), "error: No secret with id 'sec0'", "key-secret");
    }
    {
        const char *o[] = {"pool=rbd", "image=x", "server=y", NULL};
        is_str(canon(o),
               "error: Block protocol 'rbd' doesn't support the option "
               "'server'",
               "unknown key");
    }
    return tap_done();
}
