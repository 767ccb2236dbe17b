/* SPDX-License-Identifier: MIT */
/* -o option lists, following qemu's parser (checked with qemu-img create
 * -o ...: which lists it rejects outright, how ",," and repeats behave). */
#include "tap.h"
#include "util/util.h"

#include <errno.h>

int main(void)
{
    struct bi_optlist l = {0};

    is_int(bi_optlist_parse(&l, "a=1,b=x,,y"), 0, "parse a=1,b=x,,y");
    is_int(l.n, 2, "two options");
    is_str(l.v[0].key, "a", "first key");
    is_str(l.v[0].value, "1", "first value");
    is_str(l.v[1].key, "b", "second key");
    is_str(l.v[1].value, "x,y", "\",,\" is an escaped comma");

    /* Repeated -o accumulate; the last value of a key wins. */
    is_int(bi_optlist_parse(&l, "a=2,lazy_refcounts,nocompat"), 0,
           "second -o appends");
    is_int(l.n, 5, "five options after two -o");
    is_str(bi_optlist_get(&l, "a"), "2", "last occurrence wins");
    is_str(bi_optlist_get(&l, "b"), "x,y", "earlier key still visible");
    ok(l.v[3].value == NULL, "bare key has no value");
    is_str(bi_optlist_get(&l, "lazy_refcounts"), "on", "bare key reads on");
    is_str(bi_optlist_get(&l, "compat"), "off", "bare nokey reads off");
    ok(bi_optlist_get(&l, "missing") == NULL, "absent key is NULL");
    bi_optlist_free(&l);
    is_int(l.n, 0, "free empties the list");

    /* Values: empty, with '=', trailing escaped commas. */
    is_int(bi_optlist_parse(&l, "k=,e=a=b,t=x,,,,"), 0, "odd values parse");
    is_int(l.n, 3, "three options");
    is_str(l.v[0].value, "", "empty value");
    is_str(l.v[1].value, "a=b", "'=' inside a value");
    is_str(l.v[2].value, "x,,", "two escaped commas at the end");
    bi_optlist_free(&l);

    /* "=5": qemu accepts the list and then reports "Invalid parameter ''";
     * the empty key is passed on for the caller to report. */
    is_int(bi_optlist_parse(&l, "=5"), 0, "empty key parses");
    is_str(l.v[0].key, "", "empty key kept");
    is_str(l.v[0].value, "5", "its value");
    bi_optlist_free(&l);

    /* "a,,b": a bare "a", then empty, then "b", as qemu splits it. */
    is_int(bi_optlist_parse(&l, "a,,b"), 0, "a,,b parses");
    is_str(l.v[0].key, "a", "first item of a,,b is the bare key a");
    bi_optlist_free(&l);

    /* qemu-img: "Invalid option list: ..." */
    is_int(bi_optlist_parse(&l, ""), -EINVAL, "empty list rejected");
    is_int(bi_optlist_parse(&l, ","), -EINVAL, "lone comma rejected");
    is_int(bi_optlist_parse(&l, ",a=1"), -EINVAL, "leading comma rejected");
    is_int(bi_optlist_parse(&l, "a=1,"), -EINVAL, "dangling comma rejected");
    is_int(bi_optlist_parse(&l, "a=1,,,"), -EINVAL, "three commas rejected");
    is_int(l.n, 0, "rejected lists add nothing");
    is_int(bi_optlist_parse(&l, "a=1,,"), 0, "escaped trailing comma ok");
    is_str(l.v[0].value, "1,", "value ends in a comma");
    bi_optlist_free(&l);

    /* one option as it is: commas belong to the value */
    is_int(bi_optlist_add(&l, "server.host=a,b,,c"), 0, "add one option");
    is_int(bi_optlist_add(&l, "bare"), 0, "add a bare key");
    is_int(bi_optlist_add(&l, "=x"), -EINVAL, "empty key refused");
    is_int(l.n, 2, "two options added");
    is_str(l.v[0].value, "a,b,,c", "value kept as given");
    ok(l.v[1].value == NULL, "bare key has no value");
    bi_optlist_free(&l);
    return tap_done();
}
