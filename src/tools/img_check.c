/* SPDX-License-Identifier: MIT */
/* blkimg check: qemu-img check compatible (output, messages, exit codes:
 * 0 clean, 1 check failed, 2 corruptions, 3 leaks only, 63 no support). */
#include "blkimg/blkimg.h"
#include "blkimg/qcow2.h"
#include "common.h"
#include "img.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void dump_human(const struct bi_check_result *r)
{
    if (!(r->corruptions || r->leaks || r->check_errors)) {
        printf("No errors were found on the image.\n");
    } else {
        if (r->corruptions)
            printf("\n%d errors were found on the image.\n"
                   "Data may be corrupted, or further writes to the image "
                   "may corrupt it.\n",
                   r->corruptions);
        if (r->leaks)
            printf("\n%d leaked clusters were found on the image.\n"
                   "This means waste of disk space, but no harm to data.\n",
                   r->leaks);
        if (r->check_errors)
            printf("\n%d internal errors have occurred during the check.\n",
                   r->check_errors);
    }
    if (r->total_clusters != 0 && r->allocated_clusters != 0) {
        printf("%" PRIu64 "/%" PRIu64 " = %0.2f%% allocated, %0.2f%% "
               "fragmented, %0.2f%% compressed clusters\n",
               r->allocated_clusters, r->total_clusters,
               r->allocated_clusters * 100.0 / r->total_clusters,
               r->fragmented_clusters * 100.0 / r->allocated_clusters,
               r->compressed_clusters * 100.0 / r->allocated_clusters);
    }
    if (r->image_end_offset)
        printf("Image end offset: %" PRId64 "\n", r->image_end_offset);
}

static void dump_json(const struct bi_check_result *r, const char *filename,
                      const char *format)
{
    bi_value *d = bi_value_object();
    bi_value_set(d, "filename", bi_value_string(filename));
    bi_value_set(d, "format", bi_value_string(format));
    bi_value_set(d, "check-errors", bi_value_int(r->check_errors));
    if (r->image_end_offset)
        bi_value_set(d, "image-end-offset", bi_value_int(r->image_end_offset));
    if (r->corruptions)
        bi_value_set(d, "corruptions", bi_value_int(r->corruptions));
    if (r->leaks)
        bi_value_set(d, "leaks", bi_value_int(r->leaks));
    if (r->corruptions_fixed)
        bi_value_set(d, "corruptions-fixed",
                     bi_value_int(r->corruptions_fixed));
    if (r->leaks_fixed)
        bi_value_set(d, "leaks-fixed", bi_value_int(r->leaks_fixed));
    if (r->total_clusters)
        bi_value_set(d, "total-clusters", bi_value_uint(r->total_clusters));
    if (r->allocated_clusters)
        bi_value_set(d, "allocated-clusters",
                     bi_value_uint(r->allocated_clusters));
    if (r->fragmented_clusters)
        bi_value_set(d, "fragmented-clusters",
                     bi_value_uint(r->fragmented_clusters));
    if (r->compressed_clusters)
        bi_value_set(d, "compressed-clusters",
                     bi_value_uint(r->compressed_clusters));
    bi_value_print_json(stdout, d, BI_VALUE_PRETTY | BI_VALUE_QDICT_ORDER);
    bi_value_free(d);
}

static int collect(bi_node *n, int fix, struct bi_check_result *r)
{
    bi_error err;
    bi_error_init(&err);
    int ret = bi_check(n, fix, r, &err);
    /* a finding that ends the check (qemu-img reports it before "Check
     * failed") */
    if (ret < 0 && err.msg[0])
        tool_error("%s", err.msg);
    return ret;
}

int img_check(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"format", required_argument, NULL, 'f'},
        {"repair", required_argument, NULL, 'r'},
        {"output", required_argument, NULL, 256},
        {"object", required_argument, NULL, 257},
        {"image-opts", no_argument, NULL, 258},
        {"force-share", no_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    struct tool_image ti;
    const char *output = NULL, *cache = "writeback";
    enum tool_output ofmt = TOOL_OUTPUT_HUMAN;
    bool quiet = false;
    int fix = 0, c, ret;

    tool_image_init(&ti);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hf:r:T:qU", long_opts, NULL)) != -1) {
        switch (c) {
        case ':':
        case '?':
            tool_getopt_error(c, argv);
        case 'h':
            printf("usage: %s check [--object objectdef] [--image-opts] [-q] "
                   "[-f fmt] [--output=ofmt] [-r [leaks | all]] "
                   "[-T src_cache] [-U] filename\n",
                   tool_prog);
            return 0;
        case 'f':
            ti.fmt = optarg;
            break;
        case 'r':
            ti.read_write = true;
            if (!strcmp(optarg, "leaks"))
                fix = BI_CHECK_FIX_LEAKS;
            else if (!strcmp(optarg, "all"))
                fix = BI_CHECK_FIX_ALL;
            else
                tool_error_exit("Unknown option value for -r (expecting "
                                "'leaks' or 'all'): %s",
                                optarg);
            break;
        case 'T':
            cache = optarg;
            break;
        case 'q':
            quiet = true;
            break;
        case 'U':
            ti.force_share = true;
            break;
        case 256:
            output = optarg;
            break;
        case 257:
            if (tool_object_add(optarg) < 0) {
                return 1;
            }
            break;
        case 258:
            ti.image_opts = true;
            break;
        }
    }
    if (optind != argc - 1)
        tool_error_exit("Expecting one image file name");
    ti.filename = argv[optind];
    if (output && !strcmp(output, "json"))
        ofmt = TOOL_OUTPUT_JSON;
    else if (output && strcmp(output, "human") != 0) {
        tool_error("--output must be used with human or json as argument.");
        return 1;
    }
    if (bi_cache_parse(cache, &ti.cache) < 0) {
        tool_error("Invalid source cache option: %s", cache);
        return 1;
    }
    ti.cache_set = true;
    ti.quiet_probe = quiet;

    bi_node *n;
    if (!ti.image_opts && strncmp(ti.filename, "json:", 5)) {
        /* opened for checking (QEMU's BDRV_O_CHECK): a corrupt image opens
         * read-write for repair, a dirty one is not repaired by opening,
         * and tables beyond the end of the file are the check's findings */
        static const char *const check_opts[] = {"x-check=on", NULL};
        struct bi_open_opts o;
        bi_error err;
        bi_open_opts_init(&o);
        o.format = ti.fmt;
        o.read_write = fix != 0;
        o.force_share = ti.force_share;
        o.cache = o.backing_cache = ti.cache;
        o.quiet_probe = quiet;
        o.driver_opts = check_opts;
        if (fix && o.force_share) {
            tool_error("Could not open '%s': force-share=on can only be used "
                       "with read-only images",
                       ti.filename);
            return 1;
        }
        bi_error_init(&err);
        n = bi_open(ti.filename, &o, &err);
        if (!n)
            tool_report(&err);
    } else {
        n = tool_open(&ti);
    }
    if (!n)
        return 1;

    struct bi_check_result r;
    ret = collect(n, fix, &r);
    if (ret == -ENOTSUP) {
        tool_error("This image format does not support checks");
        ret = 63;
        goto out;
    }
    if (ret == 0 && (r.corruptions_fixed || r.leaks_fixed)) {
        int cf = r.corruptions_fixed, lf = r.leaks_fixed;
        if (ofmt == TOOL_OUTPUT_HUMAN && !quiet)
            printf("The following inconsistencies were found and repaired:"
                   "\n\n    %d leaked clusters\n    %d corruptions\n\n"
                   "Double checking the fixed image now...\n",
                   lf, cf);
        ret = collect(n, 0, &r);
        r.corruptions_fixed = cf;
        r.leaks_fixed = lf;
    }
    if (ret == 0 && !quiet) {
        if (ofmt == TOOL_OUTPUT_JSON)
            dump_json(&r, ti.filename, bi_node_format(n));
        else
            dump_human(&r);
    }
    fflush(stdout);
    if (ret || r.check_errors) {
        if (ret)
            tool_error("Check failed: %s", strerror(-ret));
        else
            tool_error("Check failed");
        ret = 1;
    } else if (r.corruptions) {
        ret = 2;
    } else if (r.leaks) {
        ret = 3;
    } else {
        ret = 0;
    }
out:;
    bi_error err;
    bi_error_init(&err);
    bi_close(n, &err);
    return ret;
}
