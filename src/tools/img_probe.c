/* SPDX-License-Identifier: MIT */
/*
 * blkimg probe (no qemu-img twin): how the image's file is accessed: the
 * protocol node's direct I/O limits and where each came from, the page
 * size, the file system, the sector sizes and the cache mode.
 */
#include "common.h"
#include "img.h"
#include "util/util.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int img_probe(int argc, char **argv)
{
    static const struct option long_options[] = {
        {"help", no_argument, 0, 'h'},
        {"format", required_argument, 0, 'f'},
        {"output", required_argument, 0, 256},
        {"image-opts", no_argument, 0, 257},
        {"force-share", no_argument, 0, 'U'},
        {"object", required_argument, 0, 258},
        {0, 0, 0, 0},
    };
    const char *fmt = NULL, *output = NULL;
    bool image_opts = false, force_share = false;
    enum bi_cache cache = BI_CACHE_WRITEBACK;
    enum tool_output of;
    int c;

    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hf:t:U", long_options, NULL)) != -1) {
        switch (c) {
        case ':':
        case '?':
            tool_getopt_error(c, argv);
        case 'h':
            img_help();
        case 'f':
            fmt = optarg;
            break;
        case 't':
            if (bi_cache_parse(optarg, &cache) < 0) {
                tool_error("Invalid cache option: %s", optarg);
                return 1;
            }
            break;
        case 'U':
            force_share = true;
            break;
        case 256:
            output = optarg;
            break;
        case 257:
            image_opts = true;
            break;
        case 258:
            if (tool_object_add(optarg) < 0) {
                return 1;
            }
            break;
        }
    }
    if (optind != argc - 1) {
        tool_error_exit("Expecting one image file name");
    }
    if (tool_parse_output(output, &of) < 0) {
        return 1;
    }

    struct tool_image ti;
    tool_image_init(&ti);
    ti.filename = argv[optind];
    ti.fmt = fmt;
    ti.image_opts = image_opts;
    ti.cache = cache;
    ti.cache_set = true;
    ti.force_share = force_share;
    ti.no_backing = true;
    ti.quiet_probe = true;
    bi_node *top = tool_open(&ti);
    if (!top) {
        return 1;
    }
    cache = ti.cache;
    bi_node *file = bi_node_file(top);
    if (!file) {
        file = top; /* the image is the protocol node (-f file) */
    }
    const struct bi_limits *l = bi_node_limits(file);
    struct bi_storage_info si;
    if (bi_storage_info(file, &si) < 0) {
        memset(&si, 0, sizeof(si));
        si.page_size = (uint32_t)bi_page_size();
        si.filesystem = "unknown";
    }

    if (of == TOOL_OUTPUT_JSON) {
        bi_value *j = bi_value_object();
        bi_value_set_uint(j, "request-alignment", l->request_alignment);
        bi_value_set_string(j, "request-alignment-source",
                            bi_limit_source_name(l->request_alignment_source));
        bi_value_set_uint(j, "min-mem-alignment", l->min_mem_alignment);
        bi_value_set_uint(j, "opt-mem-alignment", l->opt_mem_alignment);
        bi_value_set_string(j, "mem-alignment-source",
                            bi_limit_source_name(l->mem_alignment_source));
        bi_value_set_uint(j, "max-transfer", l->max_transfer);
        bi_value_set_uint(j, "opt-transfer", l->opt_transfer);
        bi_value_set_uint(j, "page-size", si.page_size);
        bi_value_set_string(j, "filesystem", si.filesystem);
        bi_value_set_uint(j, "logical-sector-size", si.logical_sector_size);
        bi_value_set_uint(j, "physical-sector-size", si.physical_sector_size);
        bi_value_set_string(j, "cache", bi_cache_name(cache));
        bi_value_print_json(stdout, j, BI_VALUE_PRETTY);
        bi_value_free(j);
    } else {
        printf("request alignment: %" PRIu32 "\n", l->request_alignment);
        printf("request alignment source: %s\n",
               bi_limit_source_name(l->request_alignment_source));
        printf("min mem alignment: %" PRIu32 "\n", l->min_mem_alignment);
        printf("opt mem alignment: %" PRIu32 "\n", l->opt_mem_alignment);
        printf("mem alignment source: %s\n",
               bi_limit_source_name(l->mem_alignment_source));
        if (l->max_transfer) {
            printf("max transfer: %" PRIu64 "\n", l->max_transfer);
        } else {
            printf("max transfer: unlimited\n");
        }
        if (l->opt_transfer) {
            printf("opt transfer: %" PRIu32 "\n", l->opt_transfer);
        } else {
            printf("opt transfer: none\n");
        }
        printf("page size: %" PRIu32 "\n", si.page_size);
        printf("filesystem: %s\n", si.filesystem);
        if (si.logical_sector_size) {
            printf("logical sector size: %" PRIu32 "\n",
                   si.logical_sector_size);
        } else {
            printf("logical sector size: unknown\n");
        }
        if (si.physical_sector_size) {
            printf("physical sector size: %" PRIu32 "\n",
                   si.physical_sector_size);
        } else {
            printf("physical sector size: unknown\n");
        }
        printf("cache: %s\n", bi_cache_name(cache));
    }

    bi_error err;
    bi_error_init(&err);
    if (bi_close(top, &err) < 0) {
        tool_report(&err);
        return 1;
    }
    return 0;
}
