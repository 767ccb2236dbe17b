/* SPDX-License-Identifier: MIT */
/*
 * fuzz_write: the input is an image file, opened read-write (a copy). A
 * known pattern is written at a few fixed offsets (aligned and not,
 * inside the image), read back, and read back again after closing and
 * reopening the image: when the open and every write succeeded and the
 * image was consistent to start with (bi_check finds no corruption; a
 * damaged image may map guest clusters onto one host cluster, as QEMU
 * would write them too), the bytes must be those written.
 */
#include "blkimg/qcow2.h"
#include "fuzz_common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NWRITES 4
#define WLEN 3000

/* The offsets written in an image of len bytes, not overlapping: four
 * in an image of at least 8 * WLEN bytes (the middle one aligned down by
 * up to 511 bytes still leaves room), else only the first. */
static int plan(uint64_t len, uint64_t *off)
{
    int n = 0;
    if (len < WLEN)
        return 0;
    off[n++] = 0;
    if (len >= 8 * WLEN) {
        off[n++] = len - WLEN;                 /* the last bytes */
        off[n++] = (len / 2) & ~(uint64_t)511; /* aligned, middle */
        off[n++] = (len / 4) | 1;              /* odd */
    }
    return n;
}

/* The pattern of write i. */
static void pattern(int i, uint8_t *buf)
{
    for (int k = 0; k < WLEN; k++)
        buf[k] = (uint8_t)(0xa5 ^ (i * 37) ^ (k * 7) ^ (k >> 8));
}

/* Reads each write back; they must all match. */
static void verify(bi_node *n, const uint64_t *off, int count, const char *when)
{
    uint8_t want[WLEN], got[WLEN];

    for (int i = 0; i < count; i++) {
        pattern(i, want);
        memset(got, 0, sizeof(got));
        FUZZ_ASSERT(bi_pread(n, off[i], got, WLEN) == 0,
                    "%s: reading back %llu failed", when,
                    (unsigned long long)off[i]);
        FUZZ_ASSERT(!memcmp(want, got, WLEN),
                    "%s: bytes at %llu differ from those written", when,
                    (unsigned long long)off[i]);
    }
}

/* Whether the image of n is consistent: bi_check finds nothing wrong
 * (leaks aside), or the format has no check. */
static bool consistent(bi_node *n)
{
    struct bi_check_result r;
    bi_error err;

    memset(&r, 0, sizeof(r));
    bi_error_init(&err);
    int ret = bi_check(n, 0, &r, &err);
    return ret == -ENOTSUP ||
           (ret == 0 && r.corruptions == 0 && r.check_errors == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_put_image("fuzz-write.img", data, size);
    uint64_t off[NWRITES];
    uint8_t buf[WLEN];
    bi_node *n = fuzz_open(path, true);

    if (!n)
        return 0;
    bool verifiable = consistent(n);
    int64_t len = bi_getlength(n);
    int count = len > 0 ? plan((uint64_t)len, off) : 0;
    for (int i = 0; i < count; i++) {
        pattern(i, buf);
        if (bi_pwrite(n, off[i], buf, WLEN, 0) < 0)
            count = -1; /* the image refused: nothing to verify */
    }
    if (!verifiable || (count > 0 && bi_flush(n) < 0))
        count = -1;
    if (count > 0)
        verify(n, off, count, "before close");
    if (bi_close(n, NULL) < 0 || count <= 0)
        return 0;
    n = fuzz_open(path, false);
    FUZZ_ASSERT(n, "the image written does not open again");
    verify(n, off, count, "after reopen");
    bi_close(n, NULL);
    return 0;
}
