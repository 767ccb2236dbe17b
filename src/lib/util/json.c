/* SPDX-License-Identifier: MIT */
/*
 * JSON text and values (blkimg/value.h): strings written as qemu escapes
 * them, and a small reader of JSON text into a value tree.
 */
#include "util/util.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- strings ---- */

/* Decodes one UTF-8 sequence at s (modified UTF-8: "\xC0\x80" is U+0000).
 * Returns the code point, or -1 for an invalid sequence; *end is set past
 * what was consumed: one byte for a stray or impossible byte, the lead and
 * the continuation bytes present for a truncated sequence, the whole
 * sequence otherwise. Rejected: beyond U+10FFFF, noncharacters, surrogates,
 * overlong forms other than "\xC0\x80". */
static int utf8_decode(const unsigned char *s, const unsigned char **end)
{
    static const int min_cp[5] = {0x80, 0x800, 0x10000, 0x200000, 0x4000000};
    unsigned lead = *s++, len = 0, mask;
    int cp;

    if (lead < 0x80) {
        *end = s;
        return (int)lead;
    }
    if (lead >= 0xFE || !(lead & 0x40)) {
        *end = s;
        return -1;
    }
    for (mask = 0x80; lead & mask; mask >>= 1) {
        len++;
    }
    cp = (int)(lead & (mask - 1));
    for (unsigned i = 1; i < len; i++) {
        if ((*s & 0xC0) != 0x80) {
            *end = s;
            return -1;
        }
        cp = (cp << 6) | (*s++ & 0x3F);
    }
    *end = s;
    if (cp > 0x10FFFF || (cp >= 0xFDD0 && cp <= 0xFDEF) ||
        (cp & 0xFFFE) == 0xFFFE || (cp >= 0xD800 && cp <= 0xDFFF) ||
        (cp < min_cp[len - 2] && !(cp == 0 && len == 2))) {
        return -1;
    }
    return cp;
}

void bi_value_print_string(FILE *out, const char *str)
{
    const unsigned char *p = (const unsigned char *)str;

    fputc('"', out);
    while (*p) {
        int cp = utf8_decode(p, &p);

        switch (cp) {
        case '"':
            fputs("\\\"", out);
            break;
        case '\\':
            fputs("\\\\", out);
            break;
        case '\b':
            fputs("\\b", out);
            break;
        case '\f':
            fputs("\\f", out);
            break;
        case '\n':
            fputs("\\n", out);
            break;
        case '\r':
            fputs("\\r", out);
            break;
        case '\t':
            fputs("\\t", out);
            break;
        default:
            if (cp < 0) {
                cp = 0xFFFD;
            }
            if (cp > 0xFFFF) {
                fprintf(out, "\\u%04X\\u%04X", 0xD800 + ((cp - 0x10000) >> 10),
                        0xDC00 + ((cp - 0x10000) & 0x3FF));
            } else if (cp < 0x20 || cp >= 0x7F) {
                fprintf(out, "\\u%04X", cp);
            } else {
                fputc(cp, out);
            }
        }
    }
    fputc('"', out);
}

/* ---- reading JSON text into a value */

struct jparse {
    const char *p;
    int depth;
};

static void jskip(struct jparse *j)
{
    while (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r') {
        j->p++;
    }
}

static void put_utf8(char **buf, size_t *n, unsigned cp)
{
    char *b = *buf;
    if (cp < 0x80) {
        b[(*n)++] = (char)cp;
    } else if (cp < 0x800) {
        b[(*n)++] = (char)(0xC0 | (cp >> 6));
        b[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        b[(*n)++] = (char)(0xE0 | (cp >> 12));
        b[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        b[(*n)++] = (char)(0xF0 | (cp >> 18));
        b[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        b[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static char *jstring(struct jparse *j)
{
    if (*j->p != '"') {
        return NULL;
    }
    j->p++;
    /* the raw string's length bounds the decoded one (escapes shrink) */
    const char *e = j->p;
    while (*e && *e != '"') {
        e += (*e == '\\' && e[1]) ? 2 : 1;
    }
    size_t cap = (size_t)(e - j->p) + 4, n = 0;
    char *buf = bi_xmalloc(cap);
    while (*j->p && *j->p != '"') {
        if (*j->p == '\\') {
            j->p++;
            switch (*j->p) {
            case '"':
            case '\\':
            case '/':
                buf[n++] = *j->p;
                break;
            case 'b':
                buf[n++] = '\b';
                break;
            case 'f':
                buf[n++] = '\f';
                break;
            case 'n':
                buf[n++] = '\n';
                break;
            case 'r':
                buf[n++] = '\r';
                break;
            case 't':
                buf[n++] = '\t';
                break;
            case 'u': {
                unsigned cp = 0;
                for (int i = 1; i <= 4; i++) {
                    if (!isxdigit((unsigned char)j->p[i])) {
                        free(buf);
                        return NULL;
                    }
                }
                sscanf(j->p + 1, "%4x", &cp);
                j->p += 4;
                if (cp >= 0xD800 && cp < 0xDC00 && j->p[1] == '\\' &&
                    j->p[2] == 'u') {
                    unsigned lo = 0;
                    if (sscanf(j->p + 3, "%4x", &lo) == 1 && lo >= 0xDC00 &&
                        lo < 0xE000) {
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        j->p += 6;
                    }
                }
                put_utf8(&buf, &n, cp);
                break;
            }
            default:
                free(buf);
                return NULL;
            }
            j->p++;
        } else {
            buf[n++] = *j->p++;
        }
    }
    if (*j->p != '"') {
        free(buf);
        return NULL;
    }
    j->p++;
    buf[n] = 0;
    return buf;
}

static bi_value *jvalue(struct jparse *j);

/* After a member or item: 1 at the container's closing character close
 * (consumed), 0 at a ',' (consumed), -1 at anything else. */
static int jnext(struct jparse *j, char close)
{
    jskip(j);
    if (*j->p == ',' || *j->p == close) {
        return *j->p++ == close;
    }
    return -1;
}

/* The members of an object, j->p just past its '{': into o. 0 or -1. */
static int jmembers(struct jparse *j, bi_value *o)
{
    jskip(j);
    if (*j->p == '}') {
        j->p++;
        return 0;
    }
    for (int end = 0; !end;) {
        jskip(j);
        char *k = jstring(j);
        if (!k) {
            return -1;
        }
        jskip(j);
        bi_value *v = NULL;
        if (*j->p == ':') {
            j->p++;
            v = jvalue(j);
        }
        if (v) {
            bi_value_set(o, k, v);
        }
        free(k);
        if (!v || (end = jnext(j, '}')) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The items of an array, j->p just past its '[': into o. 0 or -1. */
static int jitems(struct jparse *j, bi_value *o)
{
    jskip(j);
    if (*j->p == ']') {
        j->p++;
        return 0;
    }
    for (int end = 0; !end;) {
        bi_value *v = jvalue(j);
        if (!v) {
            return -1;
        }
        bi_value_append(o, v);
        if ((end = jnext(j, ']')) < 0) {
            return -1;
        }
    }
    return 0;
}

/* A string, true, false, null or an integer at j->p; NULL if none is. */
static bi_value *jscalar(struct jparse *j)
{
    if (*j->p == '"') {
        char *s = jstring(j);
        bi_value *o = s ? bi_value_string(s) : NULL;
        free(s);
        return o;
    }
    if (!strncmp(j->p, "null", 4)) {
        j->p += 4;
        return bi_value_null();
    }
    if (!strncmp(j->p, "true", 4) || !strncmp(j->p, "false", 5)) {
        bool t = *j->p == 't';
        j->p += t ? 4 : 5;
        return bi_value_bool(t);
    }
    if (*j->p != '-' && !isdigit((unsigned char)*j->p)) {
        return NULL;
    }
    char *end;
    bi_value *o;
    errno = 0;
    if (*j->p == '-') {
        o = bi_value_int(strtoll(j->p, &end, 10));
    } else {
        unsigned long long v = strtoull(j->p, &end, 10);
        o = v > INT64_MAX ? bi_value_uint(v) : bi_value_int((int64_t)v);
    }
    if (end == j->p || errno) {
        bi_value_free(o);
        return NULL;
    }
    j->p = end;
    return o;
}

/* One value at j->p (white space first); NULL on a syntax error or
 * nesting deeper than 64. */
static bi_value *jvalue(struct jparse *j)
{
    jskip(j);
    if (j->depth >= 64) {
        return NULL;
    }
    if (*j->p != '{' && *j->p != '[') {
        return jscalar(j);
    }
    bool obj = *j->p++ == '{';
    bi_value *o = obj ? bi_value_object() : bi_value_array();
    j->depth++;
    int ret = obj ? jmembers(j, o) : jitems(j, o);
    j->depth--;
    if (ret < 0) {
        bi_value_free(o);
        return NULL;
    }
    return o;
}

bi_value *bi_value_parse_json(const char *text)
{
    struct jparse j = {text, 0};
    bi_value *o = jvalue(&j);
    if (!o) {
        return NULL;
    }
    jskip(&j);
    if (*j.p) {
        bi_value_free(o);
        return NULL;
    }
    return o;
}
