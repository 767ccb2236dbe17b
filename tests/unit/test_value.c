/* SPDX-License-Identifier: MIT */
/*
 * Values (blkimg/value.h): building, reading JSON, and the renderings. The
 * expected texts are qemu-img 7.2 output (`qemu-img info` human and
 * `--output=json` on a qcow2 with a snapshot, one with a bitmap, a file
 * name with non-ASCII bytes) or follow its writer's rules.
 */
#include "tap.h"
#include "util/util.h"

#include <stdlib.h>

static char *buf;
static size_t buflen;
static FILE *mem;

static FILE *start(void)
{
    mem = open_memstream(&buf, &buflen);
    if (!mem) {
        tap_bail("open_memstream failed");
    }
    return mem;
}

static const char *finish(void)
{
    fclose(mem);
    return buf;
}

/* Renders v with flags, checks the text, frees both. */
static void check_json(bi_value *v, unsigned flags, const char *want,
                       const char *what)
{
    bi_value_print_json(start(), v, flags);
    is_str(finish(), want, "%s", what);
    free(buf);
    bi_value_free(v);
}

/* qemu-img info of a qcow2 with a snapshot, members added in the order of
 * qemu's ImageInfo visitor. */
static bi_value *info_qcow2(void)
{
    bi_value *o = bi_value_object(), *l = bi_value_array();
    bi_value *sn = bi_value_object(), *fs = bi_value_object();
    bi_value *d = bi_value_object();

    bi_value_set_string(o, "filename", "q.qcow2");
    bi_value_set_string(o, "format", "qcow2");
    bi_value_set_bool(o, "dirty-flag", false);
    bi_value_set_int(o, "actual-size", 409600);
    bi_value_set_uint(o, "virtual-size", 1073741824);
    bi_value_set_uint(o, "cluster-size", 65536);
    bi_value_set_string(sn, "id", "1");
    bi_value_set_string(sn, "name", "snap1");
    bi_value_set_uint(sn, "vm-state-size", 0);
    bi_value_set_uint(sn, "date-sec", 1796026061);
    bi_value_set_uint(sn, "date-nsec", 668762000);
    bi_value_set_uint(sn, "vm-clock-sec", 0);
    bi_value_set_uint(sn, "vm-clock-nsec", 0);
    bi_value_set_uint(sn, "icount", 0);
    bi_value_append(l, sn);
    bi_value_set(o, "snapshots", l);
    bi_value_set_string(d, "compat", "1.1");
    bi_value_set_string(d, "compression-type", "zlib");
    bi_value_set_bool(d, "lazy-refcounts", false);
    bi_value_set_int(d, "refcount-bits", 16);
    bi_value_set_bool(d, "corrupt", false);
    bi_value_set_bool(d, "extended-l2", false);
    bi_value_set_string(fs, "type", "qcow2");
    bi_value_set(fs, "data", d);
    bi_value_set(o, "format-specific", fs);
    return o;
}

static const char info_qcow2_want[] =
    "{\n"
    "    \"snapshots\": [\n"
    "        {\n"
    "            \"icount\": 0,\n"
    "            \"vm-clock-nsec\": 0,\n"
    "            \"name\": \"snap1\",\n"
    "            \"date-sec\": 1796026061,\n"
    "            \"date-nsec\": 668762000,\n"
    "            \"vm-clock-sec\": 0,\n"
    "            \"id\": \"1\",\n"
    "            \"vm-state-size\": 0\n"
    "        }\n"
    "    ],\n"
    "    \"virtual-size\": 1073741824,\n"
    "    \"filename\": \"q.qcow2\",\n"
    "    \"cluster-size\": 65536,\n"
    "    \"format\": \"qcow2\",\n"
    "    \"actual-size\": 409600,\n"
    "    \"format-specific\": {\n"
    "        \"type\": \"qcow2\",\n"
    "        \"data\": {\n"
    "            \"compat\": \"1.1\",\n"
    "            \"compression-type\": \"zlib\",\n"
    "            \"lazy-refcounts\": false,\n"
    "            \"refcount-bits\": 16,\n"
    "            \"corrupt\": false,\n"
    "            \"extended-l2\": false\n"
    "        }\n"
    "    },\n"
    "    \"dirty-flag\": false\n"
    "}\n";

/* The "bitmaps" member of a qcow2 with one bitmap. */
static bi_value *bitmaps(const char *name)
{
    bi_value *l = bi_value_array(), *b = bi_value_object();
    bi_value *flags = bi_value_array();
    bi_value_append(flags, bi_value_string("auto"));
    bi_value_set(b, "flags", flags);
    bi_value_set_string(b, "name", name);
    bi_value_set_uint(b, "granularity", 65536);
    bi_value_append(l, b);
    return l;
}

static void test_json_layouts(void)
{
    check_json(info_qcow2(), BI_VALUE_PRETTY | BI_VALUE_QDICT_ORDER,
               info_qcow2_want, "pretty, QDict order: qemu-img info");

    bi_value *o = bi_value_object();
    bi_value_set_bool(o, "lazy-refcounts", false);
    bi_value_set(o, "bitmaps", bitmaps("b\"m,]}0"));
    bi_value_set_int(o, "refcount-bits", 16);
    check_json(o, BI_VALUE_PRETTY,
               "{\n"
               "    \"lazy-refcounts\": false,\n"
               "    \"bitmaps\": [\n"
               "        {\n"
               "            \"flags\": [\n"
               "                \"auto\"\n"
               "            ],\n"
               "            \"name\": \"b\\\"m,]}0\",\n"
               "            \"granularity\": 65536\n"
               "        }\n"
               "    ],\n"
               "    \"refcount-bits\": 16\n"
               "}\n",
               "pretty, insertion order: nested array, escaped string");

    o = bi_value_object();
    bi_value_set(o, "flags", bi_value_array());
    bi_value_set(o, "data", bi_value_object());
    check_json(o, BI_VALUE_PRETTY,
               "{\n"
               "    \"flags\": [\n"
               "    ],\n"
               "    \"data\": {\n"
               "    }\n"
               "}\n",
               "pretty: empty array and object");
    check_json(bi_value_object(), BI_VALUE_PRETTY, "{\n}\n",
               "pretty: empty top-level object");

    /* Top-level array (qemu-img info --backing-chain). */
    bi_value *l = bi_value_array();
    o = bi_value_object();
    bi_value_set_string(o, "filename", "o.qcow2");
    bi_value_append(l, o);
    o = bi_value_object();
    bi_value_set_string(o, "filename", "q.qcow2");
    bi_value_append(l, o);
    check_json(l, BI_VALUE_PRETTY,
               "[\n"
               "    {\n"
               "        \"filename\": \"o.qcow2\"\n"
               "    },\n"
               "    {\n"
               "        \"filename\": \"q.qcow2\"\n"
               "    }\n"
               "]\n",
               "pretty: top-level array of objects");
}

static void test_compact_and_parse(void)
{
    static const char text[] =
        "{\"driver\": \"qcow2\", \"file\": {\"driver\": \"file\", "
        "\"filename\": \"a.img\"}, \"l\": [1, 18446744073709551615, "
        "-9223372036854775808], \"e\": [], \"t\": true}";
    bi_value *o = bi_value_object(), *f = bi_value_object();
    bi_value *l = bi_value_array();
    bi_value_set_string(o, "driver", "qcow2");
    bi_value_set_string(f, "driver", "file");
    bi_value_set_string(f, "filename", "a.img");
    bi_value_set(o, "file", f);
    bi_value_append(l, bi_value_int(1));
    bi_value_append(l, bi_value_uint(UINT64_MAX));
    bi_value_append(l, bi_value_int(INT64_MIN));
    bi_value_set(o, "l", l);
    bi_value_set(o, "e", bi_value_array());
    bi_value_set_bool(o, "t", true);
    check_json(o, 0, text, "compact: nested object and arrays");

    o = bi_value_parse_json(" { \"driver\" :\"qcow2\",\"file\":{\"driver\": "
                            "\"file\",\"filename\":\"a.img\"},\"l\":[1 , "
                            "18446744073709551615,-9223372036854775808],"
                            "\"e\":[ ],\"t\":true}\n");
    ok(o != NULL, "parse: spaces anywhere");
    if (o) {
        is_str(bi_value_get_string(
                   bi_value_get(bi_value_get(o, "file"), "filename")),
               "a.img", "parse: nested member");
        ok(bi_value_is_unsigned(bi_value_at(bi_value_get(o, "l"), 1, NULL)),
           "parse: integers above INT64_MAX are unsigned");
        check_json(o, 0, text, "parse: printed back as written");
    }

    o = bi_value_parse_json("\"a\\u00e9\\ud83d\\ude00\\n\"");
    ok(o && !strcmp(bi_value_get_string(o), "a\xc3\xa9\xf0\x9f\x98\x80\n"),
       "parse: \\u escapes and surrogate pairs to UTF-8");
    bi_value_free(o);

    static const char *const bad[] = {
        "",
        "{",
        "[1,]",
        "{\"a\" 1}",
        "{\"a\": 1} x",
        "\"\\q\"",
        "nul",
        "{\"a\": [1 2]}",
        "99999999999999999999",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        bi_value *v = bi_value_parse_json(bad[i]);
        ok(v == NULL, "parse refuses '%s'", bad[i]);
        bi_value_free(v);
    }
    char deep[200];
    memset(deep, '[', 65);
    memset(deep + 65, ']', 65);
    deep[130] = 0;
    ok(bi_value_parse_json(deep) == NULL, "parse: 65 levels refused");
    deep[129] = 0; /* 65 '[' then 64 ']': the first '[' left out */
    bi_value *v = bi_value_parse_json(deep + 1);
    ok(v != NULL, "parse: 64 levels accepted");
    bi_value_free(v);
}

static void test_tree(void)
{
    bi_value *o = bi_value_object();
    bi_value_set_int(o, "a", 1);
    bi_value_set_string(o, "b", "x");
    bi_value_set_bool(o, "a", true); /* replaces, keeps its place */
    const char *key = NULL;
    is_int(bi_value_count(o), 2, "set replaces an existing member");
    ok(bi_value_get_bool(bi_value_at(o, 0, &key)) && !strcmp(key, "a"),
       "replaced member keeps its place");
    ok(bi_value_get(o, "c") == NULL && bi_value_get(NULL, "a") == NULL,
       "get: missing member, no object");
    is_int(bi_value_get_int(bi_value_get(o, "b")), 0,
           "get_int of a string is 0");
    bi_value *c = bi_value_copy(o);
    bi_value_set_string(o, "b", "y");
    is_str(bi_value_get_string(bi_value_get(c, "b")), "x",
           "copy is independent");
    ok(bi_value_at(c, 2, NULL) == NULL, "at: out of range");
    bi_value_free(c);
    bi_value_free(o);
}

static void test_human(void)
{
    bi_value *d = bi_value_object();
    bi_value_set_string(d, "compat", "1.1");
    bi_value_set_string(d, "compression-type", "zlib");
    bi_value_set_bool(d, "lazy-refcounts", false);
    bi_value_set(d, "bitmaps", bitmaps("b1"));
    bi_value_set_int(d, "refcount-bits", 16);
    bi_value_set_bool(d, "corrupt", false);
    bi_value_set_bool(d, "extended-l2", false);
    bi_value_print_human(start(), 1, d);
    is_str(finish(),
           "    compat: 1.1\n"
           "    compression type: zlib\n"
           "    lazy refcounts: false\n"
           "    bitmaps:\n"
           "        [0]:\n"
           "            flags:\n"
           "                [0]: auto\n"
           "            name: b1\n"
           "            granularity: 65536\n"
           "    refcount bits: 16\n"
           "    corrupt: false\n"
           "    extended l2: false\n",
           "human: qemu-img info's format specific information");
    free(buf);
    bi_value_free(d);
}

int main(void)
{
    test_json_layouts();
    test_compact_and_parse();
    test_tree();
    test_human();

    /* String escaping, observed from qemu-img info on a file named
     * "t\xc3\xa9st\x01\xf0\x9f\x98\x80\xff\"\\q\tx.raw". */
    mem = open_memstream(&buf, &buflen);
    bi_value_print_string(mem,
                          "t\xc3\xa9st\x01\xf0\x9f\x98\x80\xff\"\\q\tx.raw");
    is_str(finish(),
           "\"t\\u00E9st\\u0001\\uD83D\\uDE00\\uFFFD\\\"\\\\q\\tx.raw\"",
           "string escapes as qemu-img prints them");
    free(buf);

    /* Rules of qemu's modified UTF-8 reader: truncated sequences, overlong
     * forms, surrogates and noncharacters become U+FFFD; \xC0\x80 is NUL;
     * DEL and controls are escaped; '/' is not. */
    mem = open_memstream(&buf, &buflen);
    bi_value_print_string(mem, "\xe2\x82" /* truncated */ "A"
                               "\xc1\xbf"          /* overlong */
                               "\xed\xa0\x80"      /* surrogate */
                               "\xef\xbf\xbe"      /* U+FFFE */
                               "\xc0\x80"          /* modified-UTF-8 NUL */
                               "\x7f/\b\f\n\r\x1f" /* controls */
                               "\xe2\x82\xac");    /* euro sign */
    is_str(finish(),
           "\"\\uFFFDA\\uFFFD\\uFFFD\\uFFFD\\u0000\\u007F/\\b\\f\\n\\r\\u001F"
           "\\u20AC\"",
           "UTF-8 validation and control escapes");
    free(buf);
    return tap_done();
}
