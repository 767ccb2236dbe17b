/* SPDX-License-Identifier: MIT */
/* Small helpers shared by every layer. */
#ifndef BI_UTIL_H
#define BI_UTIL_H

#include <endian.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>

#define BI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define BI_MAX(a, b) ((a) > (b) ? (a) : (b))
#define BI_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define BI_UNUSED(x) ((void)(x))

/* ---- alignment arithmetic (a must be a power of two unless noted) ---- */
static inline bool bi_is_pow2(uint64_t a)
{
    return a && !(a & (a - 1));
}
static inline uint64_t bi_align_down(uint64_t v, uint64_t a)
{
    return v / a * a; /* any a > 0 */
}
static inline uint64_t bi_align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a; /* any a > 0 */
}
static inline bool bi_is_aligned(uint64_t v, uint64_t a)
{
    return v % a == 0;
}
static inline bool bi_ptr_aligned(const void *p, uint64_t a)
{
    return ((uintptr_t)p % a) == 0;
}

/* ---- on-disk integers: read from any byte address ---- */
static inline uint16_t bi_ld_be16(const void *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return be16toh(v);
}
static inline uint32_t bi_ld_be32(const void *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return be32toh(v);
}
static inline uint64_t bi_ld_be64(const void *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return be64toh(v);
}
static inline void bi_st_be16(void *p, uint16_t v)
{
    v = htobe16(v);
    memcpy(p, &v, sizeof(v));
}
static inline void bi_st_be32(void *p, uint32_t v)
{
    v = htobe32(v);
    memcpy(p, &v, sizeof(v));
}
static inline void bi_st_be64(void *p, uint64_t v)
{
    v = htobe64(v);
    memcpy(p, &v, sizeof(v));
}
static inline uint32_t bi_ld_le32(const void *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return le32toh(v);
}
static inline void bi_st_le32(void *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, sizeof(v));
}
static inline void bi_st_le64(void *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, sizeof(v));
}

/* True if every iov base and length meets mem/len alignment. */
bool bi_iov_aligned(const struct iovec *iov, int iovcnt, uint64_t mem_align,
                    uint64_t len_align);
uint64_t bi_iov_size(const struct iovec *iov, int iovcnt);
/* Copies between an iovec (from byte offset) and a flat buffer. */
void bi_iov_to_buf(const struct iovec *iov, int iovcnt, uint64_t off, void *buf,
                   uint64_t len);
void bi_iov_from_buf(const struct iovec *iov, int iovcnt, uint64_t off,
                     const void *buf, uint64_t len);
void bi_iov_memset(const struct iovec *iov, int iovcnt, uint64_t off, int c,
                   uint64_t len);
/* Fills out[] with the sub-vector [off, off+len) of iov; returns its
 * entry count or -EINVAL if more than max entries would be needed. */
int bi_iov_slice(const struct iovec *iov, int iovcnt, uint64_t off,
                 uint64_t len, struct iovec *out, int max);
/* True if all bytes of buf are zero (fast). */
bool bi_buf_is_zero(const void *buf, size_t len);

/* ---- memory ---- */
size_t bi_page_size(void); /* sysconf(_SC_PAGESIZE), cached */
/* Transparent huge page size (queried from sysfs, cached), 0 if none. */
size_t bi_huge_page_size(void);
/* posix_memalign wrapper; align is raised to at least sizeof(void*). */
void *bi_alloc_aligned(size_t align, size_t size);
void bi_free_aligned(void *p);
/* malloc that aborts on failure (for small fixed bookkeeping only). */
/* Bookkeeping allocations that fail abort, saying so on stderr. */
_Noreturn void bi_out_of_memory(size_t size);
void *bi_xmalloc(size_t size);
void *bi_xzalloc(size_t size);
/* Makes room for entry n of the array p of *cap entries of elem bytes:
 * doubles *cap (from 64) when n reaches it. Returns the array (moved). */
void *bi_xgrow(void *p, size_t *cap, size_t n, size_t elem);
char *bi_xstrdup(const char *s);
char *bi_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- sizes ---- */
/* qemu_strtosz rules: 0, -EINVAL or -ERANGE (beyond 2^64 - 1). Values
 * above INT64_MAX parse fine: qemu-img range-checks them itself. */
int bi_parse_size(const char *s, uint64_t *out);
/* Same; *hex_suffix (if non-NULL) tells whether a hex number carried a
 * multiplier suffix, for which qemu-img warns "Using a multiplier suffix on
 * hex numbers is deprecated: <s>". It is set even when the parse then
 * fails ("0x1kk", "0x1000000000000000k"): qemu warns first, then reports
 * the error. */
int bi_parse_size_full(const char *s, uint64_t *out, bool *hex_suffix);
/* "%0.3g <unit>B" with units "", Ki, Mi, ... (qemu's size_to_str). */
void bi_format_size(uint64_t v, char *buf, size_t len);

/* Sends a message to the program's handler (blkimg.h), if it installed
 * one; a final newline is dropped. */
#include "blkimg/blkimg.h"
void bi_message(enum bi_message_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Sets err, if not yet set, to the message (no strerror appended) with
 * code, a negative errno, as its code: the one line a driver reports in
 * QEMU's words. Returns code. */
int bi_error_setc(bi_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- -o option lists: "a=1,b=x,,y" (",," escapes a comma) ---- */
struct bi_opt {
    char *key;
    char *value; /* NULL for a bare key */
};
struct bi_optlist {
    int n;
    struct bi_opt *v;
};
/* Appends the options of s to l (l starts zeroed; repeated -o accumulate);
 * returns 0, or -EINVAL for what qemu-img rejects as "Invalid option list:
 * <s>" (empty, leading ',', odd number of trailing ','). Keys are not
 * validated: an unknown or empty key is the caller's to report. */
int bi_optlist_parse(struct bi_optlist *l, const char *s);
/* Appends ONE option, item = "key=value" as it is (the value is all after
 * the first '=', commas included; "key" alone is a bare key): how option
 * arrays such as bi_open_opts.protocol_opts are read. 0, or -EINVAL for
 * an empty key. */
int bi_optlist_add(struct bi_optlist *l, const char *item);
/* Value of the last occurrence of key, NULL if absent; a bare "key" reads
 * as "on" and a bare "nokey" as "off", as in qemu. */
const char *bi_optlist_get(const struct bi_optlist *l, const char *key);
void bi_optlist_free(struct bi_optlist *l);
/* The value of the last "key=value" item of a NULL-terminated array of
 * them (opts may be NULL), NULL if none: how drivers read the option
 * arrays of bi_open_opts and bi_create_opts. Bare keys are not values. */
const char *bi_opts_value(const char *const *opts, const char *key);

/* ---- public structs that grow (blkimg.h, "Structs that grow") ---- */
/* Takes an option struct a program passed, given_size bytes whose first
 * field is that size, into full (full_size bytes, already holding the
 * defaults): the given fields replace the defaults, full's size field
 * becomes full_size. Returns 0, or -EINVAL if given_size is below the size
 * field (the struct was never initialised) or the bytes beyond full_size
 * are not all zero (fields of a newer API were set). */
int bi_struct_in(void *full, size_t full_size, const void *given,
                 size_t given_size);
/* Hands a filled struct (full_size bytes) to a program's given_size
 * bytes: the first min of both are copied, a larger program struct gets
 * zeroes beyond. */
void bi_struct_out(void *given, size_t given_size, const void *full,
                   size_t full_size);
/* Whether field of type lies entirely within the first size bytes. */
#define BI_FIELD_FITS(type, field, size)                                       \
    (offsetof(type, field) + sizeof(((type *)0)->field) <= (size))

/* ---- values and JSON: blkimg/value.h ---- */
#include "blkimg/value.h"

#endif
