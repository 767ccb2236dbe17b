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
    char *opened;          /* the name it was opened by */
    char *filename;        /* the node's filename */
    char *full_backing;    /* resolved backing name, NULL if unknown */
    struct qobj *specific; /* "format-specific" data dict, or NULL */
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

static struct qobj *specific_data(const struct bi_image_info *info)
{
    if (info->n_specific <= 0) {
        return NULL;
    }
    struct qobj *d = qobj_dict();
    for (int i = 0; i < info->n_specific; i++) {
        const struct bi_kv *kv = &info->specific[i];
        struct qobj *v = NULL;
        switch (kv->type) {
        case BI_KV_STR:
            v = qobj_str(kv->str);
            break;
        case BI_KV_INT:
            v = qobj_int(kv->num);
            break;
        case BI_KV_BOOL:
            v = qobj_bool(kv->num != 0);
            break;
        case BI_KV_JSON:
            v = qobj_from_json(kv->json ? kv->json : kv->str);
            if (!v) {
                v = qobj_str(kv->json ? kv->json : kv->str);
            }
            break;
        }
        qobj_put(d, kv->json_key, v);
    }
    return d;
}

static struct qobj *info_to_qobj(const struct info_item *it)
{
    const struct bi_image_info *info = &it->info;
    struct qobj *o = qobj_dict();

    /* Insertion order as qemu's ImageInfo visitor (matters only for keys
     * sharing a hash bucket). */
    qobj_put(o, "filename", qobj_str(it->filename));
    qobj_put(o, "format", qobj_str(info->format));
    qobj_put(o, "dirty-flag", qobj_bool(info->dirty_flag));
    if (info->actual_size >= 0) {
        qobj_put(o, "actual-size", qobj_int(info->actual_size));
    }
    qobj_put(o, "virtual-size", qobj_uint(info->virtual_size));
    if (info->cluster_size) {
        qobj_put(o, "cluster-size", qobj_uint(info->cluster_size));
    }
    if (info->encrypted) {
        qobj_put(o, "encrypted", qobj_bool(true));
    }
    if (info->backing_filename[0]) {
        qobj_put(o, "backing-filename", qobj_str(info->backing_filename));
        if (it->full_backing) {
            qobj_put(o, "full-backing-filename", qobj_str(it->full_backing));
        }
        if (info->backing_format[0]) {
            qobj_put(o, "backing-filename-format",
                     qobj_str(info->backing_format));
        }
    }
    if (info->n_snapshots > 0) {
        struct qobj *l = qobj_list();
        for (int i = 0; i < info->n_snapshots; i++) {
            const struct bi_snapshot_info *sn = &info->snapshots[i];
            struct qobj *s = qobj_dict();
            qobj_put(s, "id", qobj_str(sn->id));
            qobj_put(s, "name", qobj_str(sn->name));
            qobj_put(s, "vm-state-size", qobj_uint(sn->vm_state_size));
            qobj_put(s, "date-sec", qobj_uint(sn->date_sec));
            qobj_put(s, "date-nsec", qobj_uint(sn->date_nsec));
            qobj_put(s, "vm-clock-sec",
                     qobj_uint(sn->vm_clock_nsec / 1000000000ULL));
            qobj_put(s, "vm-clock-nsec",
                     qobj_uint(sn->vm_clock_nsec % 1000000000ULL));
            if (sn->icount != UINT64_MAX) {
                qobj_put(s, "icount", qobj_uint(sn->icount));
            }
            qobj_append(l, s);
        }
        qobj_put(o, "snapshots", l);
    }
    if (it->specific) {
        struct qobj *fs = qobj_dict();
        qobj_put(fs, "type", qobj_str(info->format));
        /* qobj_put takes ownership: hand over a copy via JSON text is not
         * needed; the item keeps no other reference after this. */
        qobj_put(fs, "data", it->specific);
        qobj_put(o, "format-specific", fs);
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
    if (info->backing_filename[0]) {
        printf("backing file: %s", info->backing_filename);
        if (!it->full_backing) {
            printf(" (cannot determine actual path)");
        } else if (strcmp(info->backing_filename, it->full_backing)) {
            printf(" (actual path: %s)", it->full_backing);
        }
        printf("\n");
        if (info->backing_format[0]) {
            printf("backing file format: %s\n", info->backing_format);
        }
    }
    if (info->n_snapshots > 0) {
        printf("Snapshot list:\n");
        snapshot_dump(NULL);
        printf("\n");
        for (int i = 0; i < info->n_snapshots; i++) {
            snapshot_dump(&info->snapshots[i]);
            printf("\n");
        }
    }
    if (it->specific) {
        printf("Format specific information:\n");
        qobj_print_human(stdout, 1, it->specific);
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
            tool_error("--object is not supported");
            return 1;
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
        if (it->info.backing_filename[0]) {
            if (it->info.full_backing_filename[0]) {
                it->full_backing = bi_xstrdup(it->info.full_backing_filename);
            } else {
                it->full_backing =
                    path_combine(it->filename, it->info.backing_filename);
            }
        }
        it->specific = specific_data(&it->info);
        bi_close(n, NULL);

        free(filename);
        free(cur_fmt);
        filename = NULL;
        cur_fmt = NULL;
        first = false;
        if (chain && it->info.backing_filename[0]) {
            if (!it->full_backing) {
                tool_error("Could not determine absolute backing filename, "
                           "but backing filename '%s' present",
                           it->info.backing_filename);
                goto out;
            }
            filename = bi_xstrdup(it->full_backing);
            if (it->info.backing_format[0]) {
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
        struct qobj *o;
        if (chain) {
            o = qobj_list();
            for (int i = 0; i < n_items; i++) {
                qobj_append(o, info_to_qobj(&items[i]));
                items[i].specific = NULL; /* now owned by o */
            }
        } else {
            o = info_to_qobj(&items[0]);
            items[0].specific = NULL;
        }
        qobj_print_json(stdout, o);
        qobj_free(o);
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
        qobj_free(items[i].specific);
    }
    free(items);
    return ret;
}
