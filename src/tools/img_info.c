/* SPDX-License-Identifier: MIT */
/* blkimg info: qemu-img 7.2's "info" (human and JSON, --backing-chain). */
#include "common.h"
#include "img.h"
#include "util/util.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct info_item {
    struct bi_image_info info;
    char *opened;       /* the name it was opened by */
    char *filename;     /* the node's filename */
    char *full_backing; /* resolved backing name, NULL if unknown */
};

/* qemu's path_combine(): a relative backing name is relative to the
 * directory of the image that names it. */
static char *path_combine(const char *base, const char *name)
{
    const char *slash;
    if (name[0] == '/' || name[strcspn(name, ":/")] == ':') {
        /* absolute, or "protocol:..." */
        return bi_xstrdup(name);
    }
    slash = strrchr(base, '/');
    if (!slash) {
        return bi_xstrdup(name);
    }
    return bi_xasprintf("%.*s%s", (int)(slash - base + 1), base, name);
}

/* qemu's ImageInfo of it as a value; takes it->info.specific over. */
static bi_value *info_to_value(struct info_item *it)
{
    struct bi_image_info *info = &it->info;
    bi_value *o = bi_value_object();

    /* Insertion order as qemu's ImageInfo visitor (matters only for keys
     * sharing a hash bucket). */
    bi_value_set(o, "filename", bi_value_string(it->filename));
    bi_value_set(o, "format", bi_value_string(info->format));
    if (info->has_dirty_flag) {
        bi_value_set(o, "dirty-flag", bi_value_bool(info->dirty_flag));
    }
    if (info->actual_size >= 0) {
        bi_value_set(o, "actual-size", bi_value_int(info->actual_size));
    }
    bi_value_set(o, "virtual-size", bi_value_uint(info->virtual_size));
    if (info->cluster_size) {
        bi_value_set(o, "cluster-size", bi_value_uint(info->cluster_size));
    }
    if (info->encrypted) {
        bi_value_set(o, "encrypted", bi_value_bool(true));
    }
    if (info->backing_filename) {
        bi_value_set(o, "backing-filename",
                     bi_value_string(info->backing_filename));
        if (it->full_backing) {
            bi_value_set(o, "full-backing-filename",
                         bi_value_string(it->full_backing));
        }
        if (info->backing_format) {
            bi_value_set(o, "backing-filename-format",
                         bi_value_string(info->backing_format));
        }
    }
    if (info->n_snapshots > 0) {
        bi_value *l = bi_value_array();
        for (int i = 0; i < info->n_snapshots; i++) {
            const struct bi_snapshot_info *sn = info->snapshots[i];
            bi_value *s = bi_value_object();
            bi_value_set(s, "id", bi_value_string(sn->id));
            bi_value_set(s, "name", bi_value_string(sn->name));
            bi_value_set(s, "vm-state-size", bi_value_uint(sn->vm_state_size));
            bi_value_set(s, "date-sec", bi_value_uint(sn->date_sec));
            bi_value_set(s, "date-nsec", bi_value_uint(sn->date_nsec));
            bi_value_set(s, "vm-clock-sec",
                         bi_value_uint(sn->vm_clock_nsec / 1000000000ULL));
            bi_value_set(s, "vm-clock-nsec",
                         bi_value_uint(sn->vm_clock_nsec % 1000000000ULL));
            if (sn->icount != UINT64_MAX) {
                bi_value_set(s, "icount", bi_value_uint(sn->icount));
            }
            bi_value_append(l, s);
        }
        bi_value_set(o, "snapshots", l);
    }
    if (info->specific) {
        bi_value *fs = bi_value_object();
        bi_value_set(fs, "type", bi_value_string(info->format));
        /* the item's info hands its value over to the output */
        bi_value_set(fs, "data", info->specific);
        info->specific = NULL;
        bi_value_set(o, "format-specific", fs);
    }
    return o;
}

/* qemu's bdrv_snapshot_dump(). */
static void snapshot_dump(const struct bi_snapshot_info *sn)
{
    char clock_buf[128], icount_buf[64] = "", date_buf[64] = "", size[64];

    if (!sn) {
        printf("%-10s%-17s%8s%20s%13s%11s", "ID", "TAG", "VM SIZE", "DATE",
               "VM CLOCK", "ICOUNT");
        return;
    }
    time_t t = (time_t)sn->date_sec;
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(date_buf, sizeof(date_buf), "%Y-%m-%d %H:%M:%S", &tm);
    uint64_t secs = sn->vm_clock_nsec / 1000000000ULL;
    snprintf(clock_buf, sizeof(clock_buf), "%02d:%02d:%02d.%03d",
             (int)(secs / 3600), (int)((secs / 60) % 60), (int)(secs % 60),
             (int)((sn->vm_clock_nsec / 1000000) % 1000));
    bi_format_size(sn->vm_state_size, size, sizeof(size));
    if (sn->icount != UINT64_MAX) {
        snprintf(icount_buf, sizeof(icount_buf), "%" PRId64,
                 (int64_t)sn->icount);
    }
    printf("%-9s %-16s %8s%20s%13s%11s", sn->id, sn->name, size, date_buf,
           clock_buf, icount_buf);
}

/* qemu's bdrv_image_info_dump(). */
static void dump_human(const struct info_item *it)
{
    const struct bi_image_info *info = &it->info;
    char vsize[64], dsize[64];

    bi_format_size(info->virtual_size, vsize, sizeof(vsize));
    if (info->actual_size >= 0) {
        bi_format_size((uint64_t)info->actual_size, dsize, sizeof(dsize));
    } else {
        snprintf(dsize, sizeof(dsize), "unavailable");
    }
    printf("image: %s\n"
           "file format: %s\n"
           "virtual size: %s (%" PRIu64 " bytes)\n"
           "disk size: %s\n",
           it->filename, info->format, vsize, info->virtual_size, dsize);
    if (info->encrypted) {
        printf("encrypted: yes\n");
    }
    if (info->cluster_size) {
        printf("cluster_size: %" PRIu64 "\n", info->cluster_size);
    }
    if (info->dirty_flag) {
        printf("cleanly shut down: no\n");
    }
    if (info->backing_filename) {
        printf("backing file: %s", info->backing_filename);
        if (!it->full_backing) {
            printf(" (cannot determine actual path)");
        } else if (strcmp(info->backing_filename, it->full_backing)) {
            printf(" (actual path: %s)", it->full_backing);
        }
        printf("\n");
        if (info->backing_format) {
            printf("backing file format: %s\n", info->backing_format);
        }
    }
    if (info->n_snapshots > 0) {
        printf("Snapshot list:\n");
        snapshot_dump(NULL);
        printf("\n");
        for (int i = 0; i < info->n_snapshots; i++) {
            snapshot_dump(info->snapshots[i]);
            printf("\n");
        }
    }
    if (info->specific) {
        printf("Format specific information:\n");
        bi_value_print_human(stdout, 1, info->specific);
    }
}

int img_info(int argc, char **argv)
{
    static const struct option long_options[] = {
        {"help", no_argument, 0, 'h'},
        {"format", required_argument, 0, 'f'},
        {"output", required_argument, 0, 256},
        {"backing-chain", no_argument, 0, 257},
        {"object", required_argument, 0, 258},
        {"image-opts", no_argument, 0, 259},
        {"force-share", no_argument, 0, 'U'},
        {0, 0, 0, 0},
    };
    const char *output = NULL, *fmt = NULL;
    bool chain = false, image_opts = false, force_share = false;
    enum tool_output of;
    int c, ret = 1;

    opterr = 0;
    while ((c = getopt_long(argc, argv, ":f:hU", long_options, NULL)) != -1) {
        switch (c) {
        case ':':
        case '?':
            tool_getopt_error(c, argv);
        case 'h':
            img_help();
        case 'f':
            fmt = optarg;
            break;
        case 'U':
            force_share = true;
            break;
        case 256:
            output = optarg;
            break;
        case 257:
            chain = true;
            break;
        case 258:
            if (tool_object_add(optarg) < 0) {
                return 1;
            }
            break;
        case 259:
            image_opts = true;
            break;
        }
    }
    if (optind != argc - 1) {
        tool_error_exit("Expecting one image file name");
    }
    if (tool_parse_output(output, &of) < 0) {
        return 1;
    }

    struct info_item *items = NULL;
    int n_items = 0;
    char *filename = bi_xstrdup(argv[optind]);
    char *cur_fmt = fmt ? bi_xstrdup(fmt) : NULL;
    bool first = true;

    while (filename) {
        for (int i = 0; i < n_items; i++) {
            if (!strcmp(items[i].opened, filename)) {
                tool_error("Backing file '%s' creates an infinite loop.",
                           filename);
                goto out;
            }
        }
        struct tool_image ti;
        tool_image_init(&ti);
        ti.filename = filename;
        ti.fmt = cur_fmt;
        ti.image_opts = first && image_opts;
        ti.force_share = force_share;
        ti.no_backing = true;
        ti.quiet_probe = true;
        ti.metadata_only = true;
        bi_node *n = tool_open(&ti);
        if (!n) {
            goto out;
        }
        items = realloc(items, sizeof(*items) * (size_t)(n_items + 1));
        if (!items) {
            abort();
        }
        struct info_item *it = &items[n_items++];
        memset(it, 0, sizeof(*it));
        bi_error err;
        bi_error_init(&err);
        if (bi_get_info(n, &it->info, &err) < 0) {
            tool_report(&err);
            bi_close(n, NULL);
            goto out;
        }
        it->opened = bi_xstrdup(filename);
        it->filename = bi_xstrdup(bi_node_filename(n));
        if (it->info.backing_filename) {
            if (it->info.full_backing_filename) {
                it->full_backing = bi_xstrdup(it->info.full_backing_filename);
            } else {
                it->full_backing =
                    path_combine(it->filename, it->info.backing_filename);
            }
        }
        bi_close(n, NULL);

        free(filename);
        free(cur_fmt);
        filename = NULL;
        cur_fmt = NULL;
        first = false;
        if (chain && it->info.backing_filename) {
            if (!it->full_backing) {
                tool_error("Could not determine absolute backing filename, "
                           "but backing filename '%s' present",
                           it->info.backing_filename);
                goto out;
            }
            filename = bi_xstrdup(it->full_backing);
            if (it->info.backing_format) {
                cur_fmt = bi_xstrdup(it->info.backing_format);
            }
        }
    }

    if (of == TOOL_OUTPUT_HUMAN) {
        for (int i = 0; i < n_items; i++) {
            if (i) {
                printf("\n");
            }
            dump_human(&items[i]);
        }
    } else {
        bi_value *o;
        if (chain) {
            o = bi_value_array();
            for (int i = 0; i < n_items; i++) {
                bi_value_append(o, info_to_value(&items[i]));
            }
        } else {
            o = info_to_value(&items[0]);
        }
        bi_value_print_json(stdout, o, BI_VALUE_PRETTY | BI_VALUE_QDICT_ORDER);
        bi_value_free(o);
    }
    ret = 0;
out:
    free(filename);
    free(cur_fmt);
    for (int i = 0; i < n_items; i++) {
        bi_info_free(&items[i].info);
        free(items[i].opened);
        free(items[i].filename);
        free(items[i].full_backing);
    }
    free(items);
    return ret;
}
