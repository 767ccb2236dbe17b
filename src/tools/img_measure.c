/* SPDX-License-Identifier: MIT */
/* blkimg measure: qemu-img measure compatible (bi_measure). */
#include "blkimg/blkimg.h"
#include "blkimg/convert.h"
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
void cv_getopt_error(char **argv, int c);
void cv_free_strv(char **v);
char **cv_optlist_strv(const struct bi_optlist *l);
bi_node *cv_open(const char *filename, const char *fmt, bool image_opts,
                 enum bi_cache cache, bool rw, bool force_share,
                 bool quiet_probe);

int img_measure(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"image-opts", no_argument, NULL, 256},
        {"object", required_argument, NULL, 300},
        {"output", required_argument, NULL, 257},
        {"size", required_argument, NULL, 258},
        {"force-share", no_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    const char *fmt = NULL, *out_fmt = IMG_DEFAULT_FORMAT, *filename = NULL;
    bool image_opts = false, force_share = false, json = false;
    uint64_t img_size = UINT64_MAX;
    struct bi_optlist opts;
    char **optv = NULL;
    bi_node *in = NULL;
    struct bi_measure m;
    bi_error err;
    int ret = 1, c;

    memset(&opts, 0, sizeof(opts));
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hf:O:o:l:U", long_opts, NULL)) !=
           -1) {
        switch (c) {
        case ':':
        case '?':
            cv_getopt_error(argv, c);
            goto out;
        case 'h':
            printf("usage: %s measure [--output=ofmt] [-O output_fmt] "
                   "[-o options] [--size N | [--object objectdef] "
                   "[--image-opts] [-f fmt] [-l snapshot_param] filename]\n",
                   program_invocation_short_name);
            ret = 0;
            goto out;
        case 'f':
            fmt = optarg;
            break;
        case 'O':
            out_fmt = optarg;
            break;
        case 'o':
            if (bi_optlist_parse(&opts, optarg) < 0) {
                cv_err("Invalid option list: %s", optarg);
                goto out;
            }
            break;
        case 'l':
            cv_err("Snapshots are not supported by measure (-l)");
            goto out;
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
        case 257:
            if (!strcmp(optarg, "json")) {
                json = true;
            } else if (!strcmp(optarg, "human")) {
                json = false;
            } else {
                cv_err("--output must be used with human or json as "
                       "argument.");
                goto out;
            }
            break;
        case 258: {
            uint64_t v;
            int r = bi_parse_size(optarg, &v);
            if (r < 0 && r != -ERANGE) {
                cv_err("Invalid image size specified. You may use k, M, G, "
                       "T, P or E suffixes for");
                cv_err("kilobytes, megabytes, gigabytes, terabytes, "
                       "petabytes and exabytes.");
                goto out;
            }
            if (r == -ERANGE || v > INT64_MAX) {
                cv_err("Invalid image size specified. Must be between 0 "
                       "and %" PRId64 ".",
                       INT64_MAX);
                goto out;
            }
            img_size = v;
            break;
        }
        }
    }

    if (argc - optind > 1) {
        cv_err("At most one filename argument is allowed.");
        goto out;
    } else if (argc - optind == 1) {
        filename = argv[optind];
    }
    if (!filename && (image_opts || fmt)) {
        cv_err("--image-opts, -f, and -l require a filename argument.");
        goto out;
    }
    if (filename && img_size != UINT64_MAX) {
        cv_err("--size N cannot be used together with a filename.");
        goto out;
    }
    if (!filename && img_size == UINT64_MAX) {
        cv_err("Either --size N or one filename must be specified.");
        goto out;
    }
    if (filename) {
        in = cv_open(filename, fmt, image_opts, BI_CACHE_WRITEBACK, false,
                     force_share, true);
        if (!in) {
            goto out;
        }
    }
    if (bi_format_exists(out_fmt) < 0) {
        cv_err("Unknown file format '%s'", out_fmt);
        goto out;
    }
    if (bi_format_caps(out_fmt) & BI_FORMAT_MEASURE) {
        for (int i = 0; i < opts.n; i++) {
            if (!bi_create_opt_find(out_fmt, opts.v[i].key)) {
                cv_err("Invalid parameter '%s'", opts.v[i].key);
                cv_err("Invalid options for file format '%s'", out_fmt);
                goto out;
            }
        }
    }
    if (img_size != UINT64_MAX) {
        char sz[32];
        snprintf(sz, sizeof(sz), "size=%" PRIu64, img_size);
        bi_optlist_parse(&opts, sz);
    }
    optv = cv_optlist_strv(&opts);
    bi_error_init(&err);
    if (bi_measure(out_fmt, (const char *const *)optv, in, &m, &err) < 0) {
        cv_err("%s", err.msg);
        goto out;
    }
    if (!json) {
        printf("required size: %" PRIu64 "\n", m.required);
        printf("fully allocated size: %" PRIu64 "\n", m.fully_allocated);
        if (m.has_bitmaps) {
            printf("bitmaps size: %" PRIu64 "\n", m.bitmaps);
        }
    } else {
        printf("{\n");
        if (m.has_bitmaps) {
            printf("    \"bitmaps\": %" PRIu64 ",\n", m.bitmaps);
        }
        printf("    \"required\": %" PRIu64 ",\n", m.required);
        printf("    \"fully-allocated\": %" PRIu64 "\n", m.fully_allocated);
        printf("}\n");
    }
    ret = 0;
out:
    if (in) {
        bi_close(in, NULL);
    }
    cv_free_strv(optv);
    bi_optlist_free(&opts);
    return ret;
}
