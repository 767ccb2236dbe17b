/* SPDX-License-Identifier: MIT */
/* blkimg resize: qemu-img resize compatible (bi_truncate). */
#include "blkimg/blkimg.h"
#include "common.h"
#include "img.h"
#include "util/util.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cv_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cv_err_exit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cv_getopt_error(char **argv, int c);
bi_node *cv_open(const char *filename, const char *fmt, bool image_opts,
                 enum bi_cache cache, bool rw, bool force_share,
                 bool quiet_probe);

int img_resize(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"image-opts", no_argument, NULL, 256},
        {"object", required_argument, NULL, 300},
        {"preallocation", required_argument, NULL, 257},
        {"shrink", no_argument, NULL, 258},
        {NULL, 0, NULL, 0},
    };
    const char *fmt = NULL, *size;
    bool quiet = false, image_opts = false, shrink = false;
    enum bi_prealloc prealloc = BI_PREALLOC_OFF;
    int relative = 0, c, ret = 1;
    uint64_t n;
    bi_node *node = NULL;
    bi_error err;

    /* The size is taken off argv first, so that "-1G" is no option. */
    if (argc < 3) {
        return cv_err_exit("Not enough arguments");
    }
    size = argv[--argc];

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":f:hqU", long_opts, NULL)) != -1) {
        switch (c) {
        case ':':
        case '?':
            cv_getopt_error(argv, c);
            return 1;
        case 'h':
            printf("usage: %s resize [--object objectdef] [--image-opts] "
                   "[-f fmt] [--preallocation=prealloc] [-q] [--shrink] "
                   "filename [+ | -]size\n",
                   program_invocation_short_name);
            return 0;
        case 'f':
            fmt = optarg;
            break;
        case 'q':
            quiet = true;
            break;
        case 'U':
            break;
        case 300:
            if (tool_object_add(optarg) < 0) {
                return 1;
            }
            break;
        case 256:
            image_opts = true;
            break;
        case 257:
            if (bi_prealloc_parse(optarg, &prealloc) < 0) {
                cv_err("Invalid preallocation mode '%s'", optarg);
                return 1;
            }
            break;
        case 258:
            shrink = true;
            break;
        }
    }
    if (optind != argc - 1) {
        return cv_err_exit("Expecting image file name and size");
    }
    const char *filename = argv[optind];

    if (size[0] == '+') {
        relative = 1;
        size++;
    } else if (size[0] == '-') {
        relative = -1;
        size++;
    }
    if (bi_parse_size(size, &n) < 0) {
        cv_err("Parameter 'size' expects a non-negative number below 2^64\n"
               "Optional suffix k, M, G, T, P or E means kilo-, mega-, "
               "giga-, tera-, peta-\nand exabytes, respectively.");
        return 1;
    }

    node = cv_open(filename, fmt, image_opts, BI_CACHE_WRITEBACK, true, false,
                   false);
    if (!node) {
        return 1;
    }
    int64_t cur = bi_getlength(node);
    if (cur < 0) {
        cv_err("Failed to inquire current image length: %s",
               strerror((int)-cur));
        goto out;
    }
    int64_t total;
    if (relative) {
        total = cur + (int64_t)n * relative;
    } else {
        total = (int64_t)n;
    }
    if (total <= 0) {
        cv_err("New image size must be positive");
        goto out;
    }
    if (total <= cur && prealloc != BI_PREALLOC_OFF) {
        cv_err("Preallocation can only be used for growing images");
        goto out;
    }
    if (total < cur && !shrink) {
        cv_err("Use the --shrink option to perform a shrink operation.");
        fprintf(stderr,
                "%s: warning: Shrinking an image will delete all data beyond "
                "the shrunken image's end. Before performing such an "
                "operation, make sure there is no important data there.\n",
                program_invocation_short_name);
        goto out;
    }
    bi_error_init(&err);
    if (bi_truncate(node, (uint64_t)total, true, prealloc, &err) < 0) {
        cv_err("%s", err.msg);
        goto out;
    }
    if (!quiet) {
        printf("Image resized.\n");
    }
    ret = 0;
out:
    bi_error_init(&err);
    if (bi_close(node, &err) < 0 && ret == 0) {
        cv_err("%s", err.msg);
        ret = 1;
    }
    return ret;
}
