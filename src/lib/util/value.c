/* SPDX-License-Identifier: MIT */
/*
 * Values (blkimg/value.h): the tree, and its JSON and human renderings in
 * qemu's layouts. Layout rules (observed from qemu-img 7.2 output): pretty
 * JSON puts each member on its own line indented 4 spaces a level, a closing
 * bracket on a new line at the parent's indentation, an empty container as
 * "{" newline "}"; compact JSON separates members with ", ".
 */
#include "util/util.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

struct bi_value_member {
    char *key; /* NULL in arrays */
    bi_value *v;
};

struct bi_value {
    enum bi_value_type type;
    int64_t i; /* INT (unsigned: reinterpreted), BOOL 0/1 */
    bool is_unsigned;
    char *s;
    int n, cap; /* members or items */
    struct bi_value_member *m;
};

static bi_value *value_new(enum bi_value_type t)
{
    bi_value *v = bi_xzalloc(sizeof(*v));
    v->type = t;
    return v;
}

bi_value *bi_value_object(void)
{
    return value_new(BI_VALUE_OBJECT);
}

bi_value *bi_value_array(void)
{
    return value_new(BI_VALUE_ARRAY);
}

bi_value *bi_value_null(void)
{
    return value_new(BI_VALUE_NULL);
}

bi_value *bi_value_int(int64_t x)
{
    bi_value *v = value_new(BI_VALUE_INT);
    v->i = x;
    return v;
}

bi_value *bi_value_uint(uint64_t x)
{
    bi_value *v = value_new(BI_VALUE_INT);
    v->i = (int64_t)x;
    v->is_unsigned = true;
    return v;
}

bi_value *bi_value_string(const char *s)
{
    bi_value *v = value_new(BI_VALUE_STRING);
    v->s = bi_xstrdup(s ? s : "");
    return v;
}

bi_value *bi_value_bool(bool x)
{
    bi_value *v = value_new(BI_VALUE_BOOL);
    v->i = x;
    return v;
}

void bi_value_free(bi_value *v)
{
    if (!v) {
        return;
    }
    for (int i = 0; i < v->n; i++) {
        free(v->m[i].key);
        bi_value_free(v->m[i].v);
    }
    free(v->m);
    free(v->s);
    free(v);
}

static void add_member(bi_value *c, const char *key, bi_value *v);

bi_value *bi_value_copy(const bi_value *v)
{
    bi_value *c = value_new(v->type);
    c->i = v->i;
    c->is_unsigned = v->is_unsigned;
    c->s = v->s ? bi_xstrdup(v->s) : NULL;
    for (int i = 0; i < v->n; i++) {
        add_member(c, v->m[i].key, bi_value_copy(v->m[i].v));
    }
    return c;
}

/* Appends a member (key NULL for arrays) to container c. */
static void add_member(bi_value *c, const char *key, bi_value *v)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 8;
        c->m = realloc(c->m, sizeof(*c->m) * (size_t)c->cap);
        if (!c->m) {
            abort();
        }
    }
    c->m[c->n].key = key ? bi_xstrdup(key) : NULL;
    c->m[c->n].v = v;
    c->n++;
}

void bi_value_set(bi_value *obj, const char *key, bi_value *v)
{
    for (int i = 0; i < obj->n; i++) {
        if (!strcmp(obj->m[i].key, key)) {
            bi_value_free(obj->m[i].v);
            obj->m[i].v = v;
            return;
        }
    }
    add_member(obj, key, v);
}

void bi_value_set_string(bi_value *obj, const char *key, const char *s)
{
    bi_value_set(obj, key, bi_value_string(s));
}

void bi_value_set_int(bi_value *obj, const char *key, int64_t x)
{
    bi_value_set(obj, key, bi_value_int(x));
}

void bi_value_set_uint(bi_value *obj, const char *key, uint64_t x)
{
    bi_value_set(obj, key, bi_value_uint(x));
}

void bi_value_set_bool(bi_value *obj, const char *key, bool x)
{
    bi_value_set(obj, key, bi_value_bool(x));
}

void bi_value_append(bi_value *arr, bi_value *v)
{
    add_member(arr, NULL, v);
}

enum bi_value_type bi_value_type(const bi_value *v)
{
    return v->type;
}

int bi_value_count(const bi_value *v)
{
    return v->n;
}

bi_value *bi_value_at(const bi_value *v, int i, const char **key)
{
    if (i < 0 || i >= v->n) {
        return NULL;
    }
    if (key) {
        *key = v->m[i].key;
    }
    return v->m[i].v;
}

bi_value *bi_value_get(const bi_value *obj, const char *key)
{
    if (!obj || obj->type != BI_VALUE_OBJECT) {
        return NULL;
    }
    for (int i = 0; i < obj->n; i++) {
        if (!strcmp(obj->m[i].key, key)) {
            return obj->m[i].v;
        }
    }
    return NULL;
}

int64_t bi_value_get_int(const bi_value *v)
{
    return v && v->type == BI_VALUE_INT ? v->i : 0;
}

bool bi_value_is_unsigned(const bi_value *v)
{
    return v && v->type == BI_VALUE_INT && v->is_unsigned;
}

bool bi_value_get_bool(const bi_value *v)
{
    return v && v->type == BI_VALUE_BOOL && v->i;
}

const char *bi_value_get_string(const bi_value *v)
{
    return v && v->type == BI_VALUE_STRING ? v->s : "";
}

/* ------------------------------------------------------------ printing */

/* QDict's hash of a key (QDICT_BUCKET_MAX = 512 buckets). */
static unsigned qdict_bucket(const char *name)
{
    unsigned value = 0x238F13AFu * (unsigned)strlen(name);
    for (unsigned i = 0; name[i]; i++) {
        value = value + ((unsigned)(unsigned char)name[i] << (i * 5 % 24));
    }
    return (1103515243u * value + 12345u) % 512u;
}

/* The member indexes of container c in print order: insertion order, or
 * for an object with qdict set QDict's iteration order (buckets ascending,
 * in a bucket the most recently inserted first). malloc'd. */
static int *member_order(const bi_value *c, bool qdict)
{
    int *idx = bi_xmalloc(sizeof(int) * (size_t)(c->n ? c->n : 1));
    unsigned *b = bi_xmalloc(sizeof(unsigned) * (size_t)(c->n ? c->n : 1));
    qdict = qdict && c->type == BI_VALUE_OBJECT;
    for (int i = 0; i < c->n; i++) {
        idx[i] = i;
        b[i] = qdict ? qdict_bucket(c->m[i].key) : 0;
    }
    /* insertion sort: small objects; stable for insertion order */
    for (int i = 1; qdict && i < c->n; i++) {
        int x = idx[i], j = i - 1;
        while (j >= 0 &&
               (b[idx[j]] > b[x] || (b[idx[j]] == b[x] && idx[j] < x))) {
            idx[j + 1] = idx[j];
            j--;
        }
        idx[j + 1] = x;
    }
    free(b);
    return idx;
}

/* A scalar: strings quoted and escaped for JSON, as they are for text. */
static void print_scalar(FILE *out, const bi_value *v, bool json)
{
    switch (v->type) {
    case BI_VALUE_INT:
        if (v->is_unsigned) {
            fprintf(out, "%" PRIu64, (uint64_t)v->i);
        } else {
            fprintf(out, "%" PRId64, v->i);
        }
        break;
    case BI_VALUE_BOOL:
        fputs(v->i ? "true" : "false", out);
        break;
    case BI_VALUE_NULL:
        fputs("null", out);
        break;
    case BI_VALUE_STRING:
        if (json) {
            bi_value_print_string(out, v->s);
        } else {
            fputs(v->s, out);
        }
        break;
    default:
        break;
    }
}

/* Before a member at depth (pretty: a new line and its indentation). */
static void json_break(FILE *out, int depth, unsigned flags, bool first)
{
    if (flags & BI_VALUE_PRETTY) {
        fprintf(out, "\n%*s", 4 * depth, "");
    } else if (!first) {
        fputc(' ', out);
    }
}

static void print_json(FILE *out, const bi_value *v, int depth, unsigned flags)
{
    if (v->type != BI_VALUE_OBJECT && v->type != BI_VALUE_ARRAY) {
        print_scalar(out, v, true);
        return;
    }
    bool obj = v->type == BI_VALUE_OBJECT;
    int *idx = member_order(v, flags & BI_VALUE_QDICT_ORDER);
    fputc(obj ? '{' : '[', out);
    for (int k = 0; k < v->n; k++) {
        const struct bi_value_member *m = &v->m[idx[k]];
        if (k) {
            fputc(',', out);
        }
        json_break(out, depth + 1, flags, k == 0);
        if (obj) {
            bi_value_print_string(out, m->key);
            fputs(": ", out);
        }
        print_json(out, m->v, depth + 1, flags);
    }
    if (flags & BI_VALUE_PRETTY) {
        fprintf(out, "\n%*s", 4 * depth, "");
    }
    fputc(obj ? '}' : ']', out);
    free(idx);
}

void bi_value_print_json(FILE *out, const bi_value *v, unsigned flags)
{
    print_json(out, v, 0, flags);
    if (flags & BI_VALUE_PRETTY) {
        fputc('\n', out);
    }
}

/* One line of the human dump: the label, then the value on the same line
 * (scalar) or on the lines below one level deeper (container). */
static void print_human_item(FILE *out, int indentation, const char *label,
                             bool dashes_to_spaces, const bi_value *v)
{
    bool composite = v->type == BI_VALUE_OBJECT || v->type == BI_VALUE_ARRAY;
    fprintf(out, "%*s", indentation * 4, "");
    for (const char *c = label; *c; c++) {
        fputc(dashes_to_spaces && *c == '-' ? ' ' : *c, out);
    }
    fputc(':', out);
    fputc(composite ? '\n' : ' ', out);
    bi_value_print_human(out, indentation + 1, v);
    if (!composite) {
        fputc('\n', out);
    }
}

void bi_value_print_human(FILE *out, int indentation, const bi_value *v)
{
    if (v->type != BI_VALUE_OBJECT && v->type != BI_VALUE_ARRAY) {
        print_scalar(out, v, false);
        return;
    }
    int *idx = member_order(v, true);
    for (int k = 0; k < v->n; k++) {
        const struct bi_value_member *m = &v->m[idx[k]];
        if (v->type == BI_VALUE_OBJECT) {
            print_human_item(out, indentation, m->key, true, m->v);
        } else {
            char label[32];
            snprintf(label, sizeof(label), "[%i]", k);
            print_human_item(out, indentation, label, false, m->v);
        }
    }
    free(idx);
}
