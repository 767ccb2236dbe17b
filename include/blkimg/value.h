/* SPDX-License-Identifier: MIT */
/*
 * libblkimg values: a small tree of objects, arrays, strings, integers and
 * booleans. Drivers describe what is particular to their format with one
 * (qemu-img info's "format-specific" data); tools render it as JSON or as
 * qemu's human text. One model, no JSON text passed around and parsed again.
 *
 * Ownership: a container owns its members; bi_value_set/bi_value_append take
 * ownership of the value given. Allocation failure aborts (as bi_x*).
 */
#ifndef BLKIMG_VALUE_H
#define BLKIMG_VALUE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef BI_EXPORT
#define BI_EXPORT __attribute__((visibility("default")))
#endif

enum bi_value_type {
    BI_VALUE_INT, /* signed or unsigned 64-bit (see bi_value_is_unsigned) */
    BI_VALUE_STRING,
    BI_VALUE_BOOL,
    BI_VALUE_OBJECT, /* members in insertion order, keys unique */
    BI_VALUE_ARRAY,
    BI_VALUE_NULL, /* JSON's null (json: names: "backing": null) */
};

typedef struct bi_value bi_value;

BI_EXPORT bi_value *bi_value_object(void);
BI_EXPORT bi_value *bi_value_array(void);
BI_EXPORT bi_value *bi_value_int(int64_t v);
BI_EXPORT bi_value *bi_value_uint(uint64_t v);
BI_EXPORT bi_value *bi_value_string(const char *s); /* copied; NULL: "" */
BI_EXPORT bi_value *bi_value_bool(bool v);
BI_EXPORT bi_value *bi_value_null(void);
BI_EXPORT void bi_value_free(bi_value *v); /* NULL is fine */
/* A deep copy of v. */
BI_EXPORT bi_value *bi_value_copy(const bi_value *v);

/* Sets member key of object obj to v (taking v), replacing an old value in
 * its place. */
BI_EXPORT void bi_value_set(bi_value *obj, const char *key, bi_value *v);
/* Shorthands for bi_value_set with a new scalar. */
BI_EXPORT void bi_value_set_string(bi_value *obj, const char *key,
                                   const char *s);
BI_EXPORT void bi_value_set_int(bi_value *obj, const char *key, int64_t v);
BI_EXPORT void bi_value_set_uint(bi_value *obj, const char *key, uint64_t v);
BI_EXPORT void bi_value_set_bool(bi_value *obj, const char *key, bool v);
/* Appends v (taking it) to array arr. */
BI_EXPORT void bi_value_append(bi_value *arr, bi_value *v);

BI_EXPORT enum bi_value_type bi_value_type(const bi_value *v);
/* Members of an object or items of an array (0 for scalars). */
BI_EXPORT int bi_value_count(const bi_value *v);
/* Item i (0 <= i < count) of a container; *key (may be NULL) receives the
 * member name of an object, NULL for an array. */
BI_EXPORT bi_value *bi_value_at(const bi_value *v, int i, const char **key);
/* Member key of object obj, or NULL (also when obj is not an object). */
BI_EXPORT bi_value *bi_value_get(const bi_value *obj, const char *key);
/* Scalars: the value (0, false or "" for another type). */
BI_EXPORT int64_t bi_value_get_int(const bi_value *v);
BI_EXPORT bool bi_value_is_unsigned(const bi_value *v);
BI_EXPORT bool bi_value_get_bool(const bi_value *v);
BI_EXPORT const char *bi_value_get_string(const bi_value *v);

/* Parses one JSON value (objects, arrays, strings, integers, true, false;
 * nesting up to 64 levels) spanning all of text but white space. NULL on
 * a syntax error. */
BI_EXPORT bi_value *bi_value_parse_json(const char *text);

enum bi_value_print_flags {
    /* qemu's pretty JSON: a member a line, 4 spaces an indentation level,
     * "\n" after the outermost value. Without it, qemu's one-line form:
     * {"a": 1, "b": [1, 2]}. */
    BI_VALUE_PRETTY = 1 << 0,
    /* Object members in the order QEMU's QDict iterates them (its hash
     * buckets), as qemu-img's JSON and human output list them; without it,
     * in insertion order. */
    BI_VALUE_QDICT_ORDER = 1 << 1,
};
/* Writes v as JSON; strings escaped as qemu does (bi_value_print_string). */
BI_EXPORT void bi_value_print_json(FILE *out, const bi_value *v,
                                   unsigned flags);
/* qemu's dump_qobject() (the human "Format specific information"): one
 * "key: value" a line at 4 * indentation spaces, '-' in keys shown as ' ',
 * containers on the lines below one level deeper, array items as "[i]:",
 * members in QDict order. */
BI_EXPORT void bi_value_print_human(FILE *out, int indentation,
                                    const bi_value *v);
/* Writes s as a JSON string literal with quotes, escaped as qemu does:
 * \" \\ \b \f \n \r \t, other controls and non-ASCII as \uXXXX (surrogate
 * pairs beyond the BMP), invalid UTF-8 as \uFFFD. */
BI_EXPORT void bi_value_print_string(FILE *out, const char *s);

#ifdef __cplusplus
}
#endif
#endif
