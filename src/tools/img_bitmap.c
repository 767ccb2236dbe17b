/* SPDX-License-Identifier: MIT */
/*
 * blkimg bitmap: qemu-img bitmap compatible. Every --add, --remove,
 * --clear, --enable, --disable and --merge is applied in the order given,
 * each one as its own update of the image; the first failure stops (the
 * actions before it stay done) with "Operation ... failed" and exit 1.
 */
#include "blkimg/blkimg.h"
#include "blkimg/image_ops.h"
#include "common.h"
#include "img.h"
#include "util/util.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BM_ADD, BM_REMOVE, BM_CLEAR, BM_ENABLE, BM_DISABLE, BM_MERGE };

static const char *const act_names[] = {"add",    "remove",  "clear",
                                        "enable", "disable", "merge"};

struct bm_action {
    int act;
    const char *src; /* --merge */
};

/* "<prefix>: <error>" on stderr. The errors naming a bitmap are written
 * here in full (the library's one-line message has a bounded length;
 * names go up to 1023 bytes). */
static void report(const char *prefix, const char *bitmap, const char *src,
                   bi_node *n, int r, const bi_error *err)
{
    static const char *const inconsistent =
        "Bitmap '%s' is inconsistent and cannot be used\n"
        "Try block-dirty-bitmap-remove to delete this bitmap from disk";
    const char *name = r == -ENXIO || r == -ESTALE ? src : bitmap;
    const char *fmt = NULL;
    fprintf(stderr, "%s: %s: ", tool_prog, prefix);
    switch (r) {
    case -ENOENT:
    case -ENXIO:
        fmt = "Dirty bitmap '%s' not found";
        break;
    case -EEXIST:
        fmt = "Bitmap already exists: %s";
        break;
    case -EBUSY:
    case -ESTALE:
        fmt = inconsistent;
        break;
    case -ENAMETOOLONG:
        fprintf(stderr,
                "Can't make bitmap '%s' persistent in '%s': Name length "
                "exceeds maximum (1023 characters)\n",
                bitmap, bi_node_filename(n));
        return;
    }
    if (fmt)
        fprintf(stderr, fmt, name);
    else
        fputs(err->msg[0] ? err->msg : strerror(-r), stderr);
    fputc('\n', stderr);
}

static void report_op(const char *act, const char *bitmap, const char *src,
                      bi_node *n, int r, const bi_error *err)
{
    char *prefix =
        bi_xasprintf("Operation %s on bitmap %s failed", act, bitmap);
    report(prefix, bitmap, src, n, r, err);
    free(prefix);
}

int img_bitmap(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"object", required_argument, NULL, 256},
        {"image-opts", no_argument, NULL, 257},
        {"add", no_argument, NULL, 258},
        {"remove", no_argument, NULL, 259},
        {"clear", no_argument, NULL, 260},
        {"enable", no_argument, NULL, 261},
        {"disable", no_argument, NULL, 262},
        {"merge", required_argument, NULL, 263},
        {"granularity", required_argument, NULL, 'g'},
        {"source-file", required_argument, NULL, 'b'},
        {"source-format", required_argument, NULL, 'F'},
        {NULL, 0, NULL, 0},
    };
    struct tool_image ti;
    struct bm_action *acts = calloc((size_t)argc + 1, sizeof(*acts));
    int nacts = 0, c;
    bool add = false, merge = false;
    int64_t granularity = 0;
    const char *src_file = NULL, *src_fmt = NULL;

    if (!acts)
        return 1;
    tool_image_init(&ti);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":b:hf:F:g:", long_opts, NULL)) != -1) {
        switch (c) {
        case ':':
        case '?':
            free(acts);
            tool_getopt_error(c, argv);
        case 'h':
            printf("usage: %s bitmap (--merge SOURCE | --add | --remove | "
                   "--clear | --enable | --disable)... [-b source_file "
                   "[-F source_fmt]] [-g granularity] [--object objectdef] "
                   "[--image-opts | -f fmt] filename bitmap\n",
                   tool_prog);
            free(acts);
            return 0;
        case 'b':
            src_file = optarg;
            break;
        case 'f':
            ti.fmt = optarg;
            break;
        case 'F':
            src_fmt = optarg;
            break;
        case 'g':
            granularity = tool_cvtnum("granularity", optarg);
            if (granularity < 0) {
                free(acts);
                return 1;
            }
            break;
        case 256:
            if (tool_object_add(optarg) < 0) {
                return 1;
            }
            break;
        case 257:
            ti.image_opts = true;
            break;
        case 258:
        case 259:
        case 260:
        case 261:
        case 262:
            acts[nacts++].act = c - 258;
            add |= c == 258;
            break;
        case 263:
            acts[nacts].act = BM_MERGE;
            acts[nacts++].src = optarg;
            merge = true;
            break;
        }
    }
    int ret = 1;
    bi_node *n = NULL, *src = NULL;
    if (!nacts) {
        tool_error("Need at least one of --add, --remove, --clear, --enable, "
                   "--disable, or --merge");
        goto out;
    }
    if (granularity && !add) {
        tool_error("granularity only supported with --add");
        goto out;
    }
    if (src_fmt && !src_file) {
        tool_error("-F only supported with -b");
        goto out;
    }
    if (src_file && !merge) {
        tool_error("Merge bitmap source file only supported with --merge");
        goto out;
    }
    if (optind != argc - 2) {
        tool_error("Expecting filename and bitmap name");
        goto out;
    }
    ti.filename = argv[optind];
    const char *bitmap = argv[optind + 1];
    ti.read_write = true;
    n = tool_open(&ti);
    if (!n)
        goto out;
    if (src_file) {
        struct tool_image si;
        tool_image_init(&si);
        si.filename = src_file;
        si.fmt = src_fmt;
        src = tool_open(&si);
        if (!src)
            goto out;
    }
    ret = 0;
    for (int i = 0; i < nacts && ret == 0; i++) {
        bi_error err;
        bi_error_init(&err);
        int r = 0;
        switch (acts[i].act) {
        case BM_ADD:
            r = bi_bitmap_add(n, bitmap, (uint64_t)granularity, false, &err);
            break;
        case BM_REMOVE:
            r = bi_bitmap_remove(n, bitmap, &err);
            break;
        case BM_CLEAR:
            r = bi_bitmap_clear(n, bitmap, &err);
            break;
        case BM_ENABLE:
        case BM_DISABLE:
            r = bi_bitmap_enable(n, bitmap, acts[i].act == BM_ENABLE, &err);
            break;
        case BM_MERGE:
            r = bi_bitmap_merge(n, bitmap, src ? src : n, acts[i].src, &err);
            break;
        }
        if (r < 0) {
            report_op(act_names[acts[i].act], bitmap, acts[i].src, n, r, &err);
            ret = 1;
        }
    }
out:
    if (src) {
        bi_error e;
        bi_error_init(&e);
        bi_close(src, &e);
    }
    if (n) {
        bi_error e;
        bi_error_init(&e);
        if (bi_close(n, &e) < 0 && ret == 0) {
            tool_report(&e);
            ret = 1;
        }
    }
    free(acts);
    return ret;
}

/* ------------------------------------------------- convert --bitmaps */

/* qemu-img's convert_check_bitmaps(): before the copy. */
int cv_check_bitmaps(bi_node *src, bool skip_broken)
{
    if (!bi_bitmap_supported(src)) {
        tool_error("Source lacks bitmap support");
        return -1;
    }
    struct bi_bitmap_info **v;
    int cnt;
    if (bi_bitmap_list(src, &v, &cnt) < 0) {
        tool_error("Source lacks bitmap support");
        return -1;
    }
    int ret = 0;
    /* QEMU walks its list of bitmaps: the directory backwards */
    for (int i = cnt - 1; i >= 0 && !skip_broken; i--) {
        if (v[i]->in_use) {
            tool_error("Cannot copy inconsistent bitmap '%s'", v[i]->name);
            fprintf(stderr, "Try --skip-broken-bitmaps, or use 'qemu-img "
                            "bitmap --remove' to delete it\n");
            ret = -1;
            break;
        }
    }
    bi_bitmap_list_free(v, cnt);
    return ret;
}

/* qemu-img's convert_copy_bitmaps(): after the copy; dst is the open
 * target. Bitmaps are created in the source's directory order (the order
 * QEMU stores them in); name clashes are reported in QEMU's order. */
int cv_copy_bitmaps(bi_node *src, bi_node *dst, bool skip_broken)
{
    struct bi_bitmap_info **v, **have = NULL;
    int cnt, nhave = 0, ret = 0;
    if (bi_bitmap_list(src, &v, &cnt) < 0)
        return -1;
    if (bi_bitmap_list(dst, &have, &nhave) < 0)
        nhave = 0;
    for (int i = cnt - 1; i >= 0; i--) {
        if (skip_broken && v[i]->in_use) {
            fprintf(stderr, "%s: warning: Skipping inconsistent bitmap '%s'\n",
                    tool_prog, v[i]->name);
            continue;
        }
        for (int j = 0; j < nhave; j++) {
            if (!strcmp(have[j]->name, v[i]->name)) {
                tool_error("Failed to create bitmap %s: Bitmap already "
                           "exists: %s",
                           v[i]->name, v[i]->name);
                ret = -1;
                goto out;
            }
        }
    }
    for (int i = 0; i < cnt; i++) {
        if (v[i]->in_use)
            continue; /* skipped (warned above) */
        bi_error err;
        bi_error_init(&err);
        int r = bi_bitmap_add(dst, v[i]->name, v[i]->granularity,
                              !v[i]->enabled, &err);
        if (r < 0) {
            char *prefix =
                bi_xasprintf("Failed to create bitmap %s", v[i]->name);
            report(prefix, v[i]->name, NULL, dst, r, &err);
            free(prefix);
            ret = -1;
            break;
        }
        bi_error_init(&err);
        r = bi_bitmap_merge(dst, v[i]->name, src, v[i]->name, &err);
        if (r < 0) {
            tool_error("Failed to populate bitmap %s: %s", v[i]->name,
                       err.msg[0] ? err.msg : strerror(-r));
            ret = -1;
            break;
        }
    }
out:
    bi_bitmap_list_free(v, cnt);
    bi_bitmap_list_free(have, nhave);
    return ret;
}
