/* SPDX-License-Identifier: MIT */
/*
 * blkimg rebase: qemu-img rebase compatible. Safe mode copies into the
 * image every range that is unallocated in it and reads differently in the
 * old and the new backing file (through the library's copy engine, in
 * qemu-img's steps), then records the new backing file; -u only rewrites
 * the header.
 */
#include "blkimg/blkimg.h"
#include "blkimg/convert.h"
#include "blkimg/image_ops.h"
#include "common.h"
#include "img.h"
#include "img_chain.h"
#include "progress.h"
#include "util/util.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RB_BUF_SIZE (2 * 1024 * 1024) /* qemu-img's IO_BUF_SIZE */
#define RB_COROUTINES 8

/* The node of n's backing chain whose file is path, or NULL. */
static bi_node *find_in_chain(bi_node *n, const char *path)
{
    char want[PATH_MAX], have[PATH_MAX];
    if (!realpath(path, want))
        return NULL;
    for (bi_node *b = bi_node_backing(n); b; b = bi_node_backing(b)) {
        const char *f = bi_node_filename(b);
        if (f && realpath(f, have) && !strcmp(want, have))
            return b;
    }
    return NULL;
}

/* qemu-img's progress: one step per compared 2 MiB step. */
struct rb_step {
    struct bi_progress *prog;
    float step;
};

static void rb_step_cb(void *opaque)
{
    struct rb_step *st = opaque;
    bi_progress_print(st->prog, st->step, 100);
}

/* Safe mode: the library's copy engine writes into the image what its
 * old backing view has where the new one differs (many requests in
 * flight, writes in image order). */
static int rb_copy(bi_node *top, bi_node *old_b, bi_node *new_b,
                   bi_node *prefix, const char *filename,
                   const char *out_baseimg, struct bi_progress *prog)
{
    int64_t size = bi_getlength(top);
    if (size < 0) {
        cv_err("Could not get size of '%s': %s", filename,
               strerror((int)-size));
        return -1;
    }
    if (old_b && bi_getlength(old_b) < 0) {
        cv_err("Could not get size of '%s': %s", bi_node_filename(old_b),
               strerror((int)-bi_getlength(old_b)));
        return -1;
    }
    if (new_b && bi_getlength(new_b) < 0) {
        cv_err("Could not get size of '%s': %s", out_baseimg,
               strerror((int)-bi_getlength(new_b)));
        return -1;
    }
    struct rb_step st = {prog, 0};
    if (size != 0)
        st.step =
            (float)100 / (float)(size / BI_MIN(size, (int64_t)RB_BUF_SIZE));

    struct bi_convert_opts o;
    bi_convert_opts_init(&o);
    o.mode = BI_COPY_REBASE;
    o.src = &top;
    o.n_src = 1;
    o.dst = top;
    o.old_backing = old_b;
    o.new_backing = new_b;
    o.rebase_prefix = prefix;
    o.num_coroutines = RB_COROUTINES;
    o.buf_size = RB_BUF_SIZE;
    /* bi_close flushes; qemu-img's rebase does not flush before it
     * rewrites the header either */
    o.flush = false;
    o.step = rb_step_cb;
    o.step_opaque = &st;

    bi_error err;
    const char *sig;
    bi_error_init(&err);
    int r = chain_run_copy(&o, &err, &sig);
    if (r == -ECANCELED) {
        cv_err("Interrupted by %s: '%s' still uses its old backing file (%s)",
               sig, filename, err.msg);
        return -1;
    }
    if (r < 0) {
        cv_err("%s", err.msg);
        return -1;
    }
    return 0;
}

int img_rebase(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"object", required_argument, NULL, 256},
        {"image-opts", no_argument, NULL, 257},
        {"force-share", no_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    const char *fmt = NULL, *cache = "writeback", *src_cache = "writeback";
    const char *out_baseimg = NULL, *out_basefmt = NULL;
    bool unsafe = false, progress = false, quiet = false, image_opts = false;
    bool force_share = false;
    enum bi_cache cmode, smode;
    bi_node *top = NULL, *new_b = NULL, *prefix = NULL;
    struct bi_progress prog;
    bi_error err;
    int c, ret = -1;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hf:F:b:upt:T:qU", long_opts, NULL)) !=
           -1) {
        switch (c) {
        case ':':
        case '?':
            cv_getopt_error(argv, c);
            return 1;
        case 'h':
            printf("usage: %s rebase [--object objectdef] [--image-opts] [-U] "
                   "[-q] [-f fmt] [-t cache] [-T src_cache] [-p] [-u] "
                   "-b backing_file [-F backing_fmt] filename\n",
                   program_invocation_short_name);
            return 0;
        case 'f':
            fmt = optarg;
            break;
        case 'F':
            out_basefmt = optarg;
            break;
        case 'b':
            out_baseimg = optarg;
            break;
        case 'u':
            unsafe = true;
            break;
        case 'p':
            progress = true;
            break;
        case 't':
            cache = optarg;
            break;
        case 'T':
            src_cache = optarg;
            break;
        case 'q':
            quiet = true;
            break;
        case 'U':
            force_share = true;
            break;
        case 256:
            if (tool_object_add(optarg) < 0) {
                return 1;
            }
            break;
        case 257:
            image_opts = true;
            break;
        }
    }
    if (quiet)
        progress = false;
    if (optind != argc - 1)
        return cv_err_exit("Expecting one image file name");
    if (!unsafe && !out_baseimg)
        return cv_err_exit("Must specify backing file (-b) or use unsafe "
                           "mode (-u)");
    const char *filename = argv[optind];

    bi_progress_init(&prog, progress ? BI_PROGRESS_QEMU : BI_PROGRESS_NONE,
                     2.0f, "rebase");
    bi_progress_print(&prog, 0, 100);

    if (bi_cache_parse(cache, &cmode) < 0) {
        cv_err("Invalid cache option: %s", cache);
        goto out;
    }
    if (bi_cache_parse(src_cache, &smode) < 0) {
        cv_err("Invalid source cache option: %s", src_cache);
        goto out;
    }
    top = chain_open(filename, fmt, image_opts, cmode, unsafe, false);
    if (!top)
        goto out;
    if (out_basefmt && bi_format_exists(out_basefmt) < 0) {
        cv_err("Invalid format name: '%s'", out_basefmt);
        goto out;
    }

    if (!unsafe) {
        bi_node *old_b = bi_node_backing(top);
        if (out_baseimg[0]) {
            char *path =
                chain_resolve_backing(bi_node_filename(top), out_baseimg);
            if (!path) {
                cv_err("Could not resolve backing filename: %s",
                       strerror(ENOMEM));
                goto out;
            }
            prefix = find_in_chain(top, path);
            if (prefix) {
                new_b = prefix;
            } else {
                struct bi_open_opts o;
                bi_open_opts_init(&o);
                o.format = out_basefmt;
                o.cache = smode;
                o.backing_cache = smode;
                o.force_share = force_share;
                o.quiet_probe = true;
                bi_error_init(&err);
                new_b = bi_open(path, &o, &err);
                if (!new_b) {
                    /* the library says "Could not open 'p': " twice where
                     * qemu's blk_new_open says it once */
                    char pre[PATH_MAX + 32];
                    snprintf(pre, sizeof(pre), "Could not open '%s'", path);
                    cv_err("Could not open new backing file '%s': %s",
                           out_baseimg, strip_file_prefix(err.msg, pre));
                    free(path);
                    goto out;
                }
            }
            free(path);
        }
        if (rb_copy(top, old_b, new_b, prefix, filename, out_baseimg, &prog) <
            0)
            goto out;
    }

    bi_error_init(&err);
    int r;
    if (out_baseimg && out_baseimg[0])
        r = bi_change_backing_file(top, out_baseimg, out_basefmt, true, &err);
    else
        r = bi_change_backing_file(top, NULL, NULL, false, &err);
    if (r == -ENOSPC)
        cv_err("Could not change the backing file to '%s': No space left in "
               "the file header",
               out_baseimg);
    else if (r == -EINVAL && out_baseimg && !out_basefmt)
        cv_err("Could not change the backing file to '%s': backing format "
               "must be specified",
               out_baseimg);
    else if (r < 0)
        cv_err("Could not change the backing file to '%s': %s",
               out_baseimg ? out_baseimg : "(null)", strerror(-r));
    bi_progress_print(&prog, 100, 0);
    ret = r < 0 ? -1 : 0;
out:
    bi_progress_end(&prog);
    if (new_b && !prefix) {
        bi_error_init(&err);
        bi_close(new_b, &err);
    }
    if (top) {
        bi_error_init(&err);
        if (bi_close(top, &err) < 0 && ret == 0) {
            cv_err("%s", err.msg);
            ret = -1;
        }
    }
    return ret < 0 ? 1 : 0;
}
