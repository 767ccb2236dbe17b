/* SPDX-License-Identifier: MIT */
/*
 * Structs that grow (blkimg.h): a program built with an older, smaller
 * struct gets its fields filled and nothing written beyond them (nothing
 * leaked either: the ASan build runs this); an option struct that was never
 * initialised, or that sets fields of a newer API, is refused; a larger
 * one whose extra bytes are zero is taken.
 */
#include "blkimg/blkimg.h"
#include "blkimg/image_ops.h"
#include "blkimg/qcow2.h"
#include "tap.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/blkimg-sized.XXXXXX";
static char base[64], top[64];

/* base.raw (1 MiB) and top.qcow2 over it, with one snapshot. */
static int make_images(void)
{
    struct bi_create_opts c;
    bi_error err;
    const char *qopts[] = {"cluster_size=65536", NULL};

    bi_error_init(&err);
    bi_create_opts_init(&c);
    c.format = "raw";
    c.size = 1 << 20;
    c.size_set = true;
    if (bi_create(base, &c, &err) < 0)
        return printf("# create base: %s\n", err.msg), -1;
    bi_create_opts_init(&c);
    c.format = "qcow2";
    c.size = 1 << 20;
    c.size_set = true;
    c.options = qopts;
    c.backing_file = base;
    c.backing_fmt = "raw";
    if (bi_create(top, &c, &err) < 0)
        return printf("# create top: %s\n", err.msg), -1;
    struct bi_open_opts o;
    bi_open_opts_init(&o);
    o.read_write = true;
    bi_node *n = bi_open(top, &o, &err);
    if (!n || bi_snapshot_create(n, "snap1", &err) < 0)
        return printf("# snapshot: %s\n", err.msg), -1;
    return bi_close(n, &err);
}

static void info_sizes(bi_node *n)
{
    struct bi_image_info full;
    bi_error err;

    bi_error_init(&err);
    is_int(bi_get_info(n, &full, &err), 0, "info: full size");
    ok(!strcmp(full.format, "qcow2") && full.backing_filename &&
           !strcmp(full.backing_filename, base) && full.backing_format &&
           !strcmp(full.backing_format, "raw"),
       "info: format and backing strings");
    ok(full.n_snapshots == 1 && !strcmp(full.snapshots[0]->name, "snap1") &&
           !strcmp(full.snapshots[0]->id, "1"),
       "info: the snapshot, as a list of pointers");
    bi_info_free(&full);
    ok(!full.backing_filename && !full.snapshots && !full.specific,
       "info_free clears what it frees");

    /* A program whose struct ends before the backing strings: the fields
     * it has are filled, the bytes after it are not touched, and what
     * it cannot hold is freed by the library. */
    size_t old = offsetof(struct bi_image_info, backing_filename);
    unsigned char *buf = malloc(sizeof(full) + 64);
    memset(buf, 0xa5, sizeof(full) + 64);
    is_int(bi_get_info_sized(n, (struct bi_image_info *)buf, old, &err), 0,
           "info: older, smaller struct");
    struct bi_image_info *small = (struct bi_image_info *)buf;
    ok(small->virtual_size == 1 << 20 && small->cluster_size == 65536,
       "info: the older fields are filled");
    bool untouched = true;
    for (size_t i = old; i < sizeof(full) + 64; i++)
        untouched = untouched && buf[i] == 0xa5;
    ok(untouched, "info: nothing written beyond the older struct");
    bi_info_free_sized(small, old);
    free(buf);

    /* A newer program's larger struct: zeroes beyond the library's. */
    buf = malloc(sizeof(full) + 64);
    memset(buf, 0xa5, sizeof(full) + 64);
    is_int(bi_get_info_sized(n, (struct bi_image_info *)buf, sizeof(full) + 64,
                             &err),
           0, "info: newer, larger struct");
    bool zero = true;
    for (size_t i = sizeof(full); i < sizeof(full) + 64; i++)
        zero = zero && buf[i] == 0;
    ok(zero, "info: the fields this library does not know read as zero");
    bi_info_free_sized((struct bi_image_info *)buf, sizeof(full) + 64);
    free(buf);
}

static void open_sizes(void)
{
    struct bi_open_opts o;
    bi_error err;
    bi_node *n;

    memset(&o, 0, sizeof(o)); /* not initialised */
    bi_error_init(&err);
    ok(!bi_open(base, &o, &err) && err.code == -EINVAL &&
           strstr(err.msg, "bi_open_opts_init"),
       "open: uninitialised options refused (%s)", err.msg);

    /* A newer program's struct: extra zero bytes are fine, a set one is a
     * request this library cannot honour. */
    unsigned char *buf = calloc(1, sizeof(o) + 16);
    bi_open_opts_init_sized((struct bi_open_opts *)buf, sizeof(o) + 16);
    ok(((struct bi_open_opts *)buf)->struct_size == sizeof(o),
       "init of a larger struct: the size the library knows");
    ((struct bi_open_opts *)buf)->struct_size = sizeof(o) + 16;
    bi_error_init(&err);
    n = bi_open(base, (struct bi_open_opts *)buf, &err);
    ok(n != NULL, "open: larger struct, zero tail");
    bi_close(n, NULL);
    buf[sizeof(o) + 3] = 1;
    bi_error_init(&err);
    ok(!bi_open(base, (struct bi_open_opts *)buf, &err) && err.code == -EINVAL,
       "open: a newer field set is refused");
    free(buf);

    /* An older program's struct without the later fields: defaults. */
    size_t old = offsetof(struct bi_open_opts, backing_cache);
    buf = calloc(1, sizeof(o));
    memset(buf, 0xa5, sizeof(o));
    bi_open_opts_init_sized((struct bi_open_opts *)buf, old);
    bool untouched = true;
    for (size_t i = old; i < sizeof(o); i++)
        untouched = untouched && buf[i] == 0xa5;
    ok(untouched && ((struct bi_open_opts *)buf)->struct_size == old,
       "init of a smaller struct writes only its bytes");
    bi_error_init(&err);
    n = bi_open(base, (struct bi_open_opts *)buf, &err);
    ok(n != NULL, "open: older struct");
    bi_close(n, NULL);
    free(buf);
}

static void status_and_storage(bi_node *n)
{
    struct bi_status st;
    struct bi_storage_info si;
    struct bi_check_result cr;
    bi_error err;

    is_int(bi_block_status(n, 0, 1 << 20, &st), 0, "block status");
    ok(st.len > 0 && st.depth == 0, "block status filled");
    size_t old = offsetof(struct bi_status, depth);
    memset(&st, 0xa5, sizeof(st));
    bi_block_status_sized(n, 0, 1 << 20, &st, old);
    ok(st.depth == (int)0xa5a5a5a5 && st.len > 0,
       "block status: older struct, its fields only");
    is_int(bi_storage_info(n, &si), 0, "storage info");
    ok(si.filesystem && si.filesystem[0], "filesystem: %s", si.filesystem);
    bi_error_init(&err);
    is_int(bi_check(n, 0, &cr, &err), 0, "check");
    ok(cr.corruptions == 0 && cr.leaks == 0, "check: clean");
}

int main(void)
{
    if (!mkdtemp(dir))
        tap_bail("mkdtemp");
    snprintf(base, sizeof(base), "%s/base.raw", dir);
    snprintf(top, sizeof(top), "%s/top.qcow2", dir);
    if (make_images() < 0)
        tap_bail("could not create the images");

    struct bi_open_opts o;
    bi_error err;
    bi_open_opts_init(&o);
    bi_error_init(&err);
    bi_node *n = bi_open(top, &o, &err);
    if (!n)
        tap_bail("open: %s", err.msg);
    info_sizes(n);
    status_and_storage(n);
    bi_close(n, NULL);
    open_sizes();

    unlink(top);
    unlink(base);
    rmdir(dir);
    return tap_done();
}
