/* SPDX-License-Identifier: MIT */
/*
 * fuzz_parse: the input, as a string, goes through each parser of text
 * that users or images give: sizes, -o option lists, JSON (a "json:"
 * prefix is dropped, as for json: file names) and NBD file names. Where a
 * parser has an inverse, the round trip must give the same result: a
 * size printed in decimal parses to itself, JSON printed and parsed
 * prints the same, an NBD target's canonical name names the same target
 * (see nbd()).
 */
#include "fuzz_common.h"
#include "protocol/nbd/nbd.h"
#include "util/util.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void sizes(const char *s)
{
    uint64_t v, back;
    bool hex;
    char text[64];

    if (bi_parse_size_full(s, &v, &hex) < 0)
        return;
    bi_format_size(v, text, sizeof(text));
    snprintf(text, sizeof(text), "%" PRIu64, v);
    FUZZ_ASSERT(bi_parse_size(text, &back) == 0 && back == v,
                "size %s does not parse back", text);
}

static void options(const char *s)
{
    struct bi_optlist l = {0};

    if (bi_optlist_parse(&l, s) == 0) {
        for (int i = 0; i < l.n; i++)
            (void)bi_optlist_get(&l, l.v[i].key);
        (void)bi_optlist_get(&l, "size");
    }
    bi_optlist_free(&l);
}

/* v as one-line JSON (malloc'd). */
static char *json_text(const bi_value *v)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);

    FUZZ_ASSERT(f, "open_memstream failed");
    bi_value_print_json(f, v, 0);
    fclose(f);
    return text;
}

/* The printed form of text parsed as JSON (malloc'd); text must parse. */
static char *reprint(const char *text)
{
    bi_value *v = bi_value_parse_json(text);

    FUZZ_ASSERT(v, "printed JSON does not parse: %s", text);
    char *out = json_text(v);
    bi_value_free(v);
    return out;
}

/* Printing turns invalid UTF-8 into U+FFFD, so keys distinct in the input
 * may print alike (and then merge when parsed again): the printed form
 * must parse, and from there printing and parsing are a fixed point. */
static void json(const char *s)
{
    if (!strncmp(s, "json:", 5))
        s += 5;
    bi_value *v = bi_value_parse_json(s);
    if (!v)
        return;
    bi_value_print_human(fuzz_sink(), 1, v);
    char *first = json_text(v);
    bi_value_free(v);
    char *second = reprint(first);
    char *third = reprint(second);
    FUZZ_ASSERT(!strcmp(second, third), "JSON round trip: %s -> %s", second,
                third);
    free(first);
    free(second);
    free(third);
}

/* Whether s (may be NULL) holds only letters, digits, "-._~", the
 * sub-delimiters that mean nothing in an NBD URL and extra: a name part
 * that a URL carries as it is. */
static bool plain(const char *s, const char *extra)
{
    for (; s && *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("-._~!$'()*+,=", *s) &&
            !strchr(extra, *s))
            return false;
    return true;
}

/* The canonical name of the NBD file name s (malloc'd), NULL if refused;
 * *simple tells whether the target's parts are all plain (see nbd()). */
static char *nbd_name(const char *s, bool *simple)
{
    struct bi_optlist l = {0};
    struct nbd_target t;
    char *name = NULL;
    bi_error err;

    bi_error_init(&err);
    if (bi_nbd_parse_filename(s, &l, &err) == 0) {
        char **v = bi_xzalloc(((size_t)l.n + 1) * sizeof(*v));
        for (int i = 0; i < l.n; i++)
            v[i] = bi_xasprintf("%s=%s", l.v[i].key,
                                l.v[i].value ? l.v[i].value : "");
        if (bi_nbd_target_parse((const char *const *)v, &t, &err) == 0) {
            name = bi_nbd_target_name(&t);
            *simple = plain(t.host, ":") && plain(t.port, "") &&
                      plain(t.path, "/") && plain(t.export, "/");
            bi_nbd_target_free(&t);
        }
        for (int i = 0; i < l.n; i++)
            free(v[i]);
        free(v);
    }
    bi_optlist_free(&l);
    return name;
}

/* QEMU's canonical name puts the host, socket path and export into the
 * URL as they are, so one holding a '/', '?', '&'... (the legacy form
 * nbd:HOST:PORT takes any) reads differently or not at all, in QEMU
 * too. Where all are plain, the name must parse to itself. */
static void nbd(const char *s)
{
    bool simple = false, again_simple;
    char *name = nbd_name(s, &simple);

    if (!name)
        return;
    char *again = nbd_name(name, &again_simple);
    FUZZ_ASSERT(!simple || (again && !strcmp(name, again)), "NBD name %s -> %s",
                name, again ? again : "(refused)");
    free(name);
    free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = bi_xzalloc(size + 1);

    memcpy(s, data, size);
    sizes(s);
    options(s);
    json(s);
    nbd(s);
    free(s);
    return 0;
}
