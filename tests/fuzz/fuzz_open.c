/* SPDX-License-Identifier: MIT */
/*
 * fuzz_open: the input is an image file. It is probed and opened
 * read-only through the public API, described (info, snapshots, bitmaps,
 * the format-specific value tree printed as JSON and as text), its block
 * status walked over the guest range and every guest byte read in
 * bounded chunks (the first FUZZ_MAX_GUEST bytes of bigger images). A
 * range block status calls zero must read as zeroes.
 */
#include "blkimg/image_ops.h"
#include "fuzz_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK (1u << 20)

/* What `info` asks of the image (results are only printed). */
static void describe(bi_node *n)
{
    struct bi_image_info info;
    struct bi_snapshot_info **snaps = NULL;
    struct bi_bitmap_info **bitmaps = NULL;
    int count = 0;
    bi_error err;

    memset(&info, 0, sizeof(info));
    bi_error_init(&err);
    if (bi_get_info(n, &info, &err) == 0) {
        if (info.specific) {
            bi_value_print_json(fuzz_sink(), info.specific, 0);
            bi_value_print_human(fuzz_sink(), 1, info.specific);
        }
    }
    bi_info_free(&info);
    bi_error_init(&err);
    if (bi_snapshot_list(n, &snaps, &count, &err) == 0)
        bi_snapshot_list_free(snaps, count);
    if (bi_bitmap_list(n, &bitmaps, &count) == 0)
        bi_bitmap_list_free(bitmaps, count);
    (void)bi_allocated_file_size(n);
}

/* Reads [off, off + len) in chunks; with zero, the bytes must be zero.
 * Read errors end the walk (a damaged image may fail reads). */
static int read_range(bi_node *n, uint8_t *buf, uint64_t off, uint64_t len,
                      bool zero)
{
    while (len) {
        size_t c = len < CHUNK ? (size_t)len : CHUNK;
        if (bi_pread(n, off, buf, c) < 0)
            return -1;
        for (size_t i = 0; zero && i < c; i++)
            FUZZ_ASSERT(!buf[i],
                        "byte %llu reads 0x%02x in a range reported zero",
                        (unsigned long long)(off + i), buf[i]);
        off += c;
        len -= c;
    }
    return 0;
}

/* Walks block status over [0, end) and reads each extent. */
static void walk(bi_node *n, uint64_t end)
{
    uint8_t *buf = bi_blockalign(n, CHUNK);
    FUZZ_ASSERT(buf, "out of memory");
    for (uint64_t off = 0; off < end;) {
        struct bi_status st;
        if (bi_block_status_above(n, NULL, off, end - off, &st) < 0)
            break;
        FUZZ_ASSERT(st.len > 0 && st.len <= end - off,
                    "block status at %llu: length %llu of %llu",
                    (unsigned long long)off, (unsigned long long)st.len,
                    (unsigned long long)(end - off));
        if (read_range(n, buf, off, st.len, st.flags & BI_BS_ZERO) < 0)
            break;
        off += st.len;
    }
    bi_free_aligned(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_put_image("fuzz-open.img", data, size);
    bi_node *n = fuzz_open(path, false);

    if (!n)
        return 0;
    describe(n);
    int64_t len = bi_getlength(n);
    if (len > 0)
        walk(n,
             (uint64_t)len < FUZZ_MAX_GUEST ? (uint64_t)len : FUZZ_MAX_GUEST);
    bi_close(n, NULL);
    return 0;
}
