/* SPDX-License-Identifier: MIT */
/*
 * JSON writer layout. The expected texts are qemu-img 7.2 output
 * (`qemu-img info --output=json` on a qcow2 with a snapshot, one with a
 * bitmap, a file name with non-ASCII bytes) or follow its writer's rules.
 */
#include "tap.h"
#include "util/util.h"

static char *buf;
static size_t buflen;
static FILE *mem;

static void start(struct bi_json *j, bool pretty)
{
    mem = open_memstream(&buf, &buflen);
    if (!mem) {
        tap_bail("open_memstream failed");
    }
    bi_json_init(j, mem, pretty);
}

static const char *finish(void)
{
    fclose(mem);
    return buf;
}

static void info_qcow2(bool raw_specific)
{
    struct bi_json j;

    start(&j, true);
    bi_json_begin_object(&j, NULL);
    bi_json_begin_array(&j, "snapshots");
    bi_json_begin_object(&j, NULL);
    bi_json_int(&j, "icount", 0);
    bi_json_int(&j, "vm-clock-nsec", 0);
    bi_json_str(&j, "name", "snap1");
    bi_json_uint(&j, "date-sec", 1796026061);
    bi_json_uint(&j, "date-nsec", 668762000);
    bi_json_int(&j, "vm-clock-sec", 0);
    bi_json_str(&j, "id", "1");
    bi_json_int(&j, "vm-state-size", 0);
    bi_json_end_object(&j);
    bi_json_end_array(&j);
    bi_json_uint(&j, "virtual-size", 1073741824);
    bi_json_str(&j, "filename", "q.qcow2");
    bi_json_int(&j, "cluster-size", 65536);
    bi_json_str(&j, "format", "qcow2");
    bi_json_int(&j, "actual-size", 409600);
    bi_json_begin_object(&j, "format-specific");
    bi_json_str(&j, "type", "qcow2");
    if (raw_specific) {
        bi_json_raw(&j, "data",
                    "{\"compat\": \"1.1\", \"compression-type\": \"zlib\", "
                    "\"lazy-refcounts\": false, \"refcount-bits\": 16, "
                    "\"corrupt\": false, \"extended-l2\": false}");
    } else {
        bi_json_begin_object(&j, "data");
        bi_json_str(&j, "compat", "1.1");
        bi_json_str(&j, "compression-type", "zlib");
        bi_json_bool(&j, "lazy-refcounts", false);
        bi_json_int(&j, "refcount-bits", 16);
        bi_json_bool(&j, "corrupt", false);
        bi_json_bool(&j, "extended-l2", false);
        bi_json_end_object(&j);
    }
    bi_json_end_object(&j);
    bi_json_bool(&j, "dirty-flag", false);
    bi_json_end_object(&j);
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

int main(void)
{
    struct bi_json j;

    info_qcow2(false);
    is_str(finish(), info_qcow2_want, "pretty: qemu-img info of a qcow2");
    free(buf);

    info_qcow2(true);
    is_str(finish(), info_qcow2_want, "pretty: raw nested object re-laid out");
    free(buf);

    /* Raw value holding arrays and strings with escapes, as in a qcow2
     * with a bitmap (qemu-img info output, inner part). */
    start(&j, true);
    bi_json_begin_object(&j, NULL);
    bi_json_bool(&j, "lazy-refcounts", false);
    bi_json_raw(&j, "bitmaps",
                "[{\"flags\": [\"auto\"], \"name\": \"b\\\"m,]}0\", "
                "\"granularity\": 65536}]");
    bi_json_int(&j, "refcount-bits", 16);
    bi_json_end_object(&j);
    is_str(finish(),
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
           "pretty: raw array with nested array and escaped string");
    free(buf);

    /* Raw scalars are written verbatim. */
    start(&j, true);
    bi_json_begin_object(&j, NULL);
    bi_json_raw(&j, "a", "-17");
    bi_json_raw(&j, "b", " \"x\"");
    bi_json_raw(&j, "c", "null");
    bi_json_end_object(&j);
    is_str(finish(),
           "{\n    \"a\": -17,\n    \"b\": \"x\",\n    \"c\": null\n}\n",
           "pretty: raw scalars");
    free(buf);

    /* Empty containers: bracket, newline at the parent's indentation. */
    start(&j, true);
    bi_json_begin_object(&j, NULL);
    bi_json_begin_array(&j, "flags");
    bi_json_end_array(&j);
    bi_json_begin_object(&j, "data");
    bi_json_end_object(&j);
    bi_json_raw(&j, "r", "[ ]");
    bi_json_end_object(&j);
    is_str(finish(),
           "{\n"
           "    \"flags\": [\n"
           "    ],\n"
           "    \"data\": {\n"
           "    },\n"
           "    \"r\": [\n"
           "    ]\n"
           "}\n",
           "pretty: empty array and object");
    free(buf);

    start(&j, true);
    bi_json_begin_object(&j, NULL);
    bi_json_end_object(&j);
    is_str(finish(), "{\n}\n", "pretty: empty top-level object");
    free(buf);

    /* Top-level array (qemu-img info --backing-chain). */
    start(&j, true);
    bi_json_begin_array(&j, NULL);
    bi_json_begin_object(&j, NULL);
    bi_json_str(&j, "filename", "o.qcow2");
    bi_json_end_object(&j);
    bi_json_begin_object(&j, NULL);
    bi_json_str(&j, "filename", "q.qcow2");
    bi_json_end_object(&j);
    bi_json_end_array(&j);
    is_str(finish(),
           "[\n"
           "    {\n"
           "        \"filename\": \"o.qcow2\"\n"
           "    },\n"
           "    {\n"
           "        \"filename\": \"q.qcow2\"\n"
           "    }\n"
           "]\n",
           "pretty: top-level array of objects");
    free(buf);

    /* Compact mode: qemu's one-line layout. */
    start(&j, false);
    bi_json_begin_object(&j, NULL);
    bi_json_str(&j, "driver", "qcow2");
    bi_json_begin_object(&j, "file");
    bi_json_str(&j, "driver", "file");
    bi_json_str(&j, "filename", "a.img");
    bi_json_end_object(&j);
    bi_json_begin_array(&j, "l");
    bi_json_int(&j, NULL, 1);
    bi_json_uint(&j, NULL, UINT64_MAX);
    bi_json_int(&j, NULL, INT64_MIN);
    bi_json_end_array(&j);
    bi_json_begin_array(&j, "e");
    bi_json_end_array(&j);
    bi_json_raw(&j, "r", "{ \"x\" : [1,2] }");
    bi_json_end_object(&j);
    is_str(finish(),
           "{\"driver\": \"qcow2\", \"file\": {\"driver\": \"file\", "
           "\"filename\": \"a.img\"}, \"l\": [1, 18446744073709551615, "
           "-9223372036854775808], \"e\": [], \"r\": {\"x\": [1, 2]}}",
           "compact: nested object, arrays, raw");
    free(buf);

    /* String escaping, observed from qemu-img info on a file named
     * "t\xc3\xa9st\x01\xf0\x9f\x98\x80\xff\"\\q\tx.raw". */
    mem = open_memstream(&buf, &buflen);
    bi_json_write_string(mem,
                         "t\xc3\xa9st\x01\xf0\x9f\x98\x80\xff\"\\q\tx.raw");
    is_str(finish(),
           "\"t\\u00E9st\\u0001\\uD83D\\uDE00\\uFFFD\\\"\\\\q\\tx.raw\"",
           "string escapes as qemu-img prints them");
    free(buf);

    /* Rules of qemu's modified UTF-8 reader: truncated sequences, overlong
     * forms, surrogates and noncharacters become U+FFFD; \xC0\x80 is NUL;
     * DEL and controls are escaped; '/' is not. */
    mem = open_memstream(&buf, &buflen);
    bi_json_write_string(mem, "\xe2\x82" /* truncated */ "A"
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
