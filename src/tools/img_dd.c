/* SPDX-License-Identifier: MIT */
/*
 * blkimg dd: qemu-img dd compatible (bs=, count=, skip=, if=, of=, -f, -O).
 * Like qemu-img, count limits the input size counted from the start of the
 * input (before skip). The output is created fresh, so blocks that block
 * status reports as zero are not read and all-zero blocks are not written:
 * same bytes, sparser output.
 */
#include "blkimg/blkimg.h"
#include "common.h"
#include "img.h"
#include "util/util.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cv_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cv_getopt_error(char **argv, int c);
const char *strip_file_prefix(const char *msg, const char *file);
bool cv_is_source_file(bi_node *const *src, int n_src, const char *path);
bi_node *cv_open(const char *filename, const char *fmt, bool image_opts,
                 enum bi_cache cache, bool rw, bool force_share,
                 bool quiet_probe);

/* qemu-img's cvtnum_full(): prints the error, returns -1 on failure. */
static int64_t cvtnum(const char *name, const char *v, int64_t min, int64_t max)
{
    uint64_t res;
    int r = bi_parse_size(v, &res);
    if (r < 0 && r != -ERANGE) {
        cv_err("Invalid %s specified. You may use k, M, G, T, P or E "
               "suffixes for",
               name);
        cv_err("kilobytes, megabytes, gigabytes, terabytes, petabytes and "
               "exabytes.");
        return -1;
    }
    if (r == -ERANGE || res > (uint64_t)max || (int64_t)res < min) {
        cv_err("Invalid %s specified. Must be between %" PRId64 " and %" PRId64
               ".",
               name, min, max);
        return -1;
    }
    return (int64_t)res;
}

int img_dd(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"image-opts", no_argument, NULL, 256},
        {"object", required_argument, NULL, 300},
        {"force-share", no_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    const char *fmt = NULL, *out_fmt = IMG_DEFAULT_FORMAT;
    const char *in_name = NULL, *out_name = NULL;
    bool image_opts = false, force_share = false;
    bool has_count = false, has_skip = false;
    int64_t bsz = 512, count = 0, skip = 0;
    bi_node *in = NULL, *out = NULL;
    uint8_t *buf = NULL;
    bi_error err;
    int ret = 1, c;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hf:O:U", long_opts, NULL)) != -1) {
        switch (c) {
        case ':':
        case '?':
            cv_getopt_error(argv, c);
            return 1;
        case 'h':
            printf("usage: %s dd [--image-opts] [-U] [-f fmt] [-O output_fmt] "
                   "[bs=block_size] [count=blocks] [skip=blocks] if=input "
                   "of=output\n",
                   program_invocation_short_name);
            return 0;
        case 'f':
            fmt = optarg;
            break;
        case 'O':
            out_fmt = optarg;
            break;
        case 'U':
            force_share = true;
            break;
        case 300:
            if (tool_object_add(optarg) < 0) {
                return 1;
            }
            break;
        case 256:
            image_opts = true;
            break;
        }
    }
    for (int i = optind; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strchr(a, '=');
        if (!eq) {
            cv_err("unrecognized operand %s", a);
            return 1;
        }
        size_t kl = (size_t)(eq - a);
        const char *v = eq + 1;
        if (kl == 2 && !strncmp(a, "bs", 2)) {
            bsz = cvtnum("bs", v, 1, INT_MAX);
            if (bsz < 0) {
                return 1;
            }
        } else if (kl == 5 && !strncmp(a, "count", 5)) {
            count = cvtnum("count", v, 0, INT64_MAX);
            if (count < 0) {
                return 1;
            }
            has_count = true;
        } else if (kl == 2 && !strncmp(a, "if", 2)) {
            in_name = v;
        } else if (kl == 2 && !strncmp(a, "of", 2)) {
            out_name = v;
        } else if (kl == 4 && !strncmp(a, "skip", 4)) {
            skip = cvtnum("skip", v, 0, INT64_MAX);
            if (skip < 0) {
                return 1;
            }
            has_skip = true;
        } else {
            char *k = bi_xasprintf("%.*s", (int)kl, a);
            cv_err("unrecognized operand %s", k);
            free(k);
            return 1;
        }
    }
    if (!in_name || !out_name) {
        cv_err("Must specify both input and output files");
        return 1;
    }
    in = cv_open(in_name, fmt, image_opts, BI_CACHE_WRITEBACK, false,
                 force_share, true);
    if (!in) {
        return 1;
    }
    if (bi_format_exists(out_fmt) < 0) {
        cv_err("Unknown file format");
        goto out;
    }
    if (!(bi_format_caps(out_fmt) & BI_FORMAT_CREATE)) {
        cv_err("Format driver '%s' does not support image creation", out_fmt);
        goto out;
    }
    int64_t size = bi_getlength(in);
    if (size < 0) {
        cv_err("Failed to get size for '%s'", in_name);
        goto out;
    }
    if (has_count && count <= INT64_MAX / bsz && count * bsz < size) {
        size = count * bsz;
    }
    bool beyond = has_skip && (skip > INT64_MAX / bsz || size < bsz * skip);
    struct bi_create_opts co;
    bi_create_opts_init(&co);
    co.format = out_fmt;
    /* image sizes are whole sectors, as qemu-img's create makes them */
    co.size = beyond ? 0 : bi_align_up((uint64_t)(size - bsz * skip), 512);
    co.size_set = true;
    if (cv_is_source_file(&in, 1, out_name)) {
        cv_err("%s: error while creating output image: Failed to get "
               "\"write\" lock\nIs another process using the image [%s]?",
               out_name, out_name);
        goto out;
    }
    bi_error_init(&err);
    if (bi_create(out_name, &co, &err) < 0) {
        cv_err("%s: error while creating output image: %s", out_name,
               strip_file_prefix(err.msg, out_name));
        goto out;
    }
    out = cv_open(out_name, out_fmt, false, BI_CACHE_WRITEBACK, true, false,
                  true);
    if (!out) {
        goto out;
    }
    int64_t in_pos, out_pos = 0;
    if (beyond) {
        cv_err("%s: cannot skip to specified offset", in_name);
        in_pos = size;
    } else {
        in_pos = skip * bsz;
    }
    buf = bi_blockalign(in, (size_t)bsz);
    if (!buf) {
        cv_err("error while reading from input image file: %s",
               strerror(ENOMEM));
        goto out;
    }
    while (in_pos < size) {
        int64_t bytes = in_pos + bsz > size ? size - in_pos : bsz;
        struct bi_status st;
        int r;

        memset(&st, 0, sizeof(st));
        if (bi_block_status_above(in, NULL, (uint64_t)in_pos, (uint64_t)bytes,
                                  &st) == 0 &&
            (st.flags & BI_BS_ZERO) && st.len >= (uint64_t)bytes) {
            /* zeroes on a fresh target: nothing to read or write */
        } else {
            r = bi_pread(in, (uint64_t)in_pos, buf, (size_t)bytes);
            if (r < 0) {
                cv_err("error while reading from input image file: %s",
                       strerror(-r));
                goto out;
            }
            if (!bi_buf_is_zero(buf, (size_t)bytes)) {
                r = bi_pwrite(out, (uint64_t)out_pos, buf, (size_t)bytes, 0);
                if (r < 0) {
                    cv_err("error while writing to output image file: %s",
                           strerror(-r));
                    goto out;
                }
            }
        }
        in_pos += bytes;
        out_pos += bytes;
    }
    ret = 0;
out:
    bi_free_aligned(buf);
    if (out) {
        bi_error_init(&err);
        if (bi_close(out, &err) < 0 && ret == 0) {
            cv_err("%s", err.msg);
            ret = 1;
        }
    }
    bi_close(in, NULL);
    return ret;
}
