/* SPDX-License-Identifier: MIT */
/*
 * JSON output laid out the way qemu prints it. Layout rules (observed from
 * qemu-img 7.2 output): a member after another is preceded by "," and, in
 * pretty mode, a newline plus 4 spaces per open container, in compact mode
 * a space; the first member of a container goes on a new line (pretty) or
 * right after the bracket (compact); a closing bracket goes on a new line at
 * the parent's indentation (pretty) or right after the last member.
 */
#include "util/util.h"

#include <assert.h>
#include <inttypes.h>
#include <string.h>

void bi_json_init(struct bi_json *j, FILE *out, bool pretty)
{
    memset(j, 0, sizeof(*j));
    j->out = out;
    j->pretty = pretty;
}

static void newline_indent(struct bi_json *j)
{
    fprintf(j->out, "\n%*s", j->depth * 4, "");
}

/* Separator and key before a member. The key is escaped from key, or, for
 * raw input, copied from the already escaped token tok[0..toklen). */
static void member_start_tok(struct bi_json *j, const char *key,
                             const char *tok, size_t toklen)
{
    if (j->need_comma) {
        fputc(',', j->out);
        if (j->pretty) {
            newline_indent(j);
        } else {
            fputc(' ', j->out);
        }
    } else {
        if (j->started && j->pretty) {
            newline_indent(j);
        }
        j->need_comma = true;
    }
    j->started = true;
    if (j->depth > 0 && !j->is_array[j->depth - 1]) {
        if (tok) {
            fwrite(tok, 1, toklen, j->out);
        } else {
            bi_json_write_string(j->out, key ? key : "");
        }
        fputs(": ", j->out);
    }
}

static void member_start(struct bi_json *j, const char *key)
{
    member_start_tok(j, key, NULL, 0);
}

static void container_open(struct bi_json *j, bool array)
{
    fputc(array ? '[' : '{', j->out);
    assert(j->depth < BI_JSON_MAX_DEPTH);
    j->is_array[j->depth++] = array;
    j->need_comma = false;
}

static void container_begin(struct bi_json *j, const char *key, bool array)
{
    member_start(j, key);
    container_open(j, array);
}

static void container_end(struct bi_json *j, bool array)
{
    assert(j->depth > 0 && j->is_array[j->depth - 1] == array);
    j->depth--;
    j->need_comma = true;
    if (j->pretty) {
        newline_indent(j);
    }
    fputc(array ? ']' : '}', j->out);
    if (j->depth == 0 && j->pretty) {
        fputc('\n', j->out);
    }
}

void bi_json_begin_object(struct bi_json *j, const char *key)
{
    container_begin(j, key, false);
}

void bi_json_end_object(struct bi_json *j)
{
    container_end(j, false);
}

void bi_json_begin_array(struct bi_json *j, const char *key)
{
    container_begin(j, key, true);
}

void bi_json_end_array(struct bi_json *j)
{
    container_end(j, true);
}

void bi_json_str(struct bi_json *j, const char *key, const char *v)
{
    member_start(j, key);
    bi_json_write_string(j->out, v);
}

void bi_json_int(struct bi_json *j, const char *key, int64_t v)
{
    member_start(j, key);
    fprintf(j->out, "%" PRId64, v);
}

void bi_json_uint(struct bi_json *j, const char *key, uint64_t v)
{
    member_start(j, key);
    fprintf(j->out, "%" PRIu64, v);
}

void bi_json_bool(struct bi_json *j, const char *key, bool v)
{
    member_start(j, key);
    fputs(v ? "true" : "false", j->out);
}

/* ---- raw values ---- */

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
        p++;
    }
    return p;
}

/* End of the string token starting at the opening quote p. */
static const char *string_end(const char *p)
{
    p++;
    while (*p && *p != '"') {
        if (*p == '\\' && p[1]) {
            p++;
        }
        p++;
    }
    return *p ? p + 1 : p;
}

/* End of a scalar token (number, true, false, null). */
static const char *scalar_end(const char *p)
{
    while (*p && !strchr(",]} \t\r\n:", *p)) {
        p++;
    }
    return p;
}

/* Writes the value at p under a key given either as text (key) or as an
 * escaped token (tok, toklen); returns the position after the value. */
static const char *raw_value(struct bi_json *j, const char *key,
                             const char *tok, size_t toklen, const char *p)
{
    const char *e;

    p = skip_ws(p);
    if (*p == '{' || *p == '[') {
        bool array = *p == '[';
        char close = array ? ']' : '}';

        member_start_tok(j, key, tok, toklen);
        container_open(j, array);
        p = skip_ws(p + 1);
        while (*p && *p != close) {
            const char *kt = NULL;
            size_t kl = 0;

            if (!array) {
                e = string_end(p);
                kt = p;
                kl = (size_t)(e - p);
                p = skip_ws(e);
                if (*p == ':') {
                    p++;
                }
            }
            p = skip_ws(raw_value(j, NULL, kt, kl, p));
            if (*p == ',') {
                p = skip_ws(p + 1);
            }
        }
        container_end(j, array);
        return *p ? p + 1 : p;
    }
    e = *p == '"' ? string_end(p) : scalar_end(p);
    member_start_tok(j, key, tok, toklen);
    fwrite(p, 1, (size_t)(e - p), j->out);
    return e;
}

void bi_json_raw(struct bi_json *j, const char *key, const char *raw)
{
    raw_value(j, key, NULL, 0, raw);
}

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

void bi_json_write_string(FILE *out, const char *str)
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
