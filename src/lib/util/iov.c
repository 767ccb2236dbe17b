/* SPDX-License-Identifier: MIT */
/* iovec helpers and zero detection. */
#include "util/util.h"

#include <assert.h>
#include <errno.h>
#include <string.h>

bool bi_iov_aligned(const struct iovec *iov, int iovcnt, uint64_t mem_align,
                    uint64_t len_align)
{
    for (int i = 0; i < iovcnt; i++) {
        if (mem_align > 1 && !bi_ptr_aligned(iov[i].iov_base, mem_align)) {
            return false;
        }
        if (len_align > 1 && !bi_is_aligned(iov[i].iov_len, len_align)) {
            return false;
        }
    }
    return true;
}

uint64_t bi_iov_size(const struct iovec *iov, int iovcnt)
{
    uint64_t n = 0;

    for (int i = 0; i < iovcnt; i++) {
        n += iov[i].iov_len;
    }
    return n;
}

/* Finds the entry holding byte off; *in is set to the offset inside it. */
static int iov_find(const struct iovec *iov, int iovcnt, uint64_t off,
                    uint64_t *in)
{
    int i = 0;

    while (i < iovcnt && off >= iov[i].iov_len) {
        off -= iov[i].iov_len;
        i++;
    }
    *in = off;
    return i;
}

void bi_iov_to_buf(const struct iovec *iov, int iovcnt, uint64_t off, void *buf,
                   uint64_t len)
{
    uint64_t in;
    int i = iov_find(iov, iovcnt, off, &in);
    char *p = buf;

    for (; len > 0 && i < iovcnt; i++, in = 0) {
        uint64_t n = BI_MIN(len, iov[i].iov_len - in);

        if (n > 0) {
            memcpy(p, (const char *)iov[i].iov_base + in, n);
        }
        p += n;
        len -= n;
    }
    assert(len == 0 && "bi_iov_to_buf: range beyond the vector");
}

void bi_iov_from_buf(const struct iovec *iov, int iovcnt, uint64_t off,
                     const void *buf, uint64_t len)
{
    uint64_t in;
    int i = iov_find(iov, iovcnt, off, &in);
    const char *p = buf;

    for (; len > 0 && i < iovcnt; i++, in = 0) {
        uint64_t n = BI_MIN(len, iov[i].iov_len - in);

        if (n > 0) {
            memcpy((char *)iov[i].iov_base + in, p, n);
        }
        p += n;
        len -= n;
    }
    assert(len == 0 && "bi_iov_from_buf: range beyond the vector");
}

void bi_iov_memset(const struct iovec *iov, int iovcnt, uint64_t off, int c,
                   uint64_t len)
{
    uint64_t in;
    int i = iov_find(iov, iovcnt, off, &in);

    for (; len > 0 && i < iovcnt; i++, in = 0) {
        uint64_t n = BI_MIN(len, iov[i].iov_len - in);

        if (n > 0) {
            memset((char *)iov[i].iov_base + in, c, n);
        }
        len -= n;
    }
    assert(len == 0 && "bi_iov_memset: range beyond the vector");
}

int bi_iov_slice(const struct iovec *iov, int iovcnt, uint64_t off,
                 uint64_t len, struct iovec *out, int max)
{
    uint64_t in;
    int i = iov_find(iov, iovcnt, off, &in);
    int n = 0;

    for (; len > 0 && i < iovcnt; i++, in = 0) {
        uint64_t part = BI_MIN(len, iov[i].iov_len - in);

        if (part == 0) {
            continue;
        }
        if (n == max) {
            return -EINVAL;
        }
        out[n].iov_base = (char *)iov[i].iov_base + in;
        out[n].iov_len = part;
        n++;
        len -= part;
    }
    if (len > 0) {
        return -EINVAL; /* the range runs past the end of the vector */
    }
    return n;
}

bool bi_buf_is_zero(const void *buf, size_t len)
{
    const unsigned char *p = buf;

    /* Bytes up to the first 8-byte boundary. */
    while (len > 0 && ((uintptr_t)p & 7)) {
        if (*p) {
            return false;
        }
        p++;
        len--;
    }
    /* 64 bytes per step, or-ing words so the compiler can vectorise; the
     * early exit per step keeps non-zero buffers cheap. */
    const uint64_t *w = (const uint64_t *)(const void *)p;
    while (len >= 64) {
        uint64_t acc = w[0] | w[1] | w[2] | w[3] | w[4] | w[5] | w[6] | w[7];

        if (acc) {
            return false;
        }
        w += 8;
        len -= 64;
    }
    while (len >= 8) {
        if (*w) {
            return false;
        }
        w++;
        len -= 8;
    }
    p = (const unsigned char *)w;
    while (len > 0) {
        if (*p) {
            return false;
        }
        p++;
        len--;
    }
    return true;
}
