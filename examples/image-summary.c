/* SPDX-License-Identifier: MIT */
/*
 * image-summary: a small program using libblkimg, built against an
 * installed copy through pkg-config:
 *
 *   cc -o image-summary image-summary.c $(pkg-config --cflags --libs blkimg)
 *   ./image-summary disk.qcow2
 *
 * It opens an image read-only (format probed, or given with -f), prints its
 * format and virtual size, then walks the block status of the whole backing
 * chain and prints how many bytes read as data, as zeroes and from nowhere
 * (unallocated in every layer), the sums `blkimg map --output=json` gives.
 * Exit status 0 on success, 1 on any error (printed on stderr).
 */
#include <blkimg/blkimg.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

struct totals {
    uint64_t data, zero, unallocated;
};

/* Adds the block status of [0, size) of n to t. Returns 0 or a negative
 * errno. */
static int sum_status(bi_node *n, uint64_t size, struct totals *t)
{
    for (uint64_t off = 0; off < size;) {
        struct bi_status st;
        int ret = bi_block_status_above(n, NULL, off, size - off, &st);
        if (ret < 0) {
            return ret;
        }
        if (st.len == 0) {
            return -EIO; /* no progress */
        }
        if (!(st.flags & BI_BS_ALLOCATED)) {
            t->unallocated += st.len;
        } else if (st.flags & BI_BS_ZERO) {
            t->zero += st.len;
        } else {
            t->data += st.len;
        }
        off += st.len;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct bi_open_opts o;
    const char *file = argc == 2 ? argv[1] : NULL;
    bi_error err;

    bi_open_opts_init(&o);
    o.quiet_probe = true;
    if (argc == 4 && !strcmp(argv[1], "-f")) {
        o.format = argv[2];
        file = argv[3];
    }
    if (!file) {
        fprintf(stderr, "usage: image-summary [-f FORMAT] FILE\n");
        return 1;
    }
    bi_error_init(&err);
    bi_node *n = bi_open(file, &o, &err);
    if (!n) {
        fprintf(stderr, "image-summary: %s\n", err.msg);
        return 1;
    }
    int64_t size = bi_getlength(n);
    struct totals t = {0, 0, 0};
    int ret = size < 0 ? (int)size : sum_status(n, (uint64_t)size, &t);
    if (ret < 0) {
        fprintf(stderr, "image-summary: %s: %s\n", file, strerror(-ret));
        bi_close(n, NULL);
        return 1;
    }
    char human[32];
    bi_format_size((uint64_t)size, human, sizeof(human));
    printf("format: %s\n", bi_node_format(n));
    printf("virtual size: %s (%" PRId64 " bytes)\n", human, size);
    printf("data: %" PRIu64 "\n", t.data);
    printf("zero: %" PRIu64 "\n", t.zero);
    printf("unallocated: %" PRIu64 "\n", t.unallocated);
    return bi_close(n, &err) < 0 ? 1 : 0;
}
