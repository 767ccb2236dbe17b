/* SPDX-License-Identifier: MIT */
/* blkimg snapshot: qemu-img snapshot compatible (-l, -c, -a, -d). */
#include "blkimg/blkimg.h"
#include "blkimg/image_ops.h"
#include "common.h"
#include "img.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { SN_LIST = 1, SN_APPLY, SN_CREATE, SN_DELETE };

/* qemu's bdrv_snapshot_dump(): the header when sn is NULL. */
static void dump_one(const struct bi_snapshot_info *sn)
{
    if (!sn) {
        printf("%-10s%-17s%8s%20s%13s%11s", "ID", "TAG", "VM SIZE", "DATE",
               "VM CLOCK", "ICOUNT");
        return;
    }
    char date[64] = "", clock_buf[64], size[64], icount[32] = "";
    time_t t = (time_t)sn->date_sec;
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", &tm);
    uint64_t secs = sn->vm_clock_nsec / 1000000000ULL;
    snprintf(clock_buf, sizeof(clock_buf), "%02d:%02d:%02d.%03d",
             (int)(secs / 3600), (int)((secs / 60) % 60), (int)(secs % 60),
             (int)((sn->vm_clock_nsec / 1000000) % 1000));
    bi_format_size(sn->vm_state_size, size, sizeof(size));
    if (sn->icount != UINT64_MAX)
        snprintf(icount, sizeof(icount), "%" PRId64, (int64_t)sn->icount);
    printf("%-9s %-16s %8s%20s%13s%11s", sn->id, sn->name, size, date,
           clock_buf, icount);
}

int img_snapshot(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"object", required_argument, NULL, 256},
        {"image-opts", no_argument, NULL, 257},
        {"force-share", no_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    struct tool_image ti;
    const char *name = NULL;
    int action = 0, c, ret = 0;
    bool quiet = false;

    tool_image_init(&ti);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":la:c:d:hqU", long_opts, NULL)) !=
           -1) {
        switch (c) {
        case ':':
        case '?':
            tool_getopt_error(c, argv);
        case 'h':
            printf("usage: %s snapshot [--object objectdef] [--image-opts] "
                   "[-U] [-q] [-l | -a snapshot | -c snapshot | -d snapshot] "
                   "filename\n",
                   tool_prog);
            return 0;
        case 'l':
        case 'a':
        case 'c':
        case 'd':
            if (action)
                tool_error_exit("Cannot mix '-l', '-a', '-c', '-d'");
            action = c == 'l'   ? SN_LIST
                     : c == 'a' ? SN_APPLY
                     : c == 'c' ? SN_CREATE
                                : SN_DELETE;
            if (c != 'l')
                name = optarg;
            break;
        case 'q':
            quiet = true;
            break;
        case 'U':
            ti.force_share = true;
            break;
        case 256:
            if (tool_object_add(optarg) < 0) {
                return 1;
            }
            break;
        case 257:
            ti.image_opts = true;
            break;
        }
    }
    if (optind != argc - 1)
        tool_error_exit("Expecting one image file name");
    ti.filename = argv[optind];
    /* no action: qemu-img opens the image and does nothing */
    ti.read_write = action != SN_LIST && action != 0;
    /* qemu-img 7.2 opens the backing chain too: a missing backing file
     * fails the command, and backing.* options are taken */
    ti.quiet_probe = quiet;

    bi_node *n = tool_open(&ti);
    if (!n)
        return 1;
    bi_error err;
    bi_error_init(&err);
    switch (action) {
    case SN_LIST: {
        struct bi_snapshot_info **v = NULL;
        int cnt = 0;
        if (bi_snapshot_list(n, &v, &cnt, &err) == 0 && cnt > 0) {
            printf("Snapshot list:\n");
            dump_one(NULL);
            printf("\n");
            for (int i = 0; i < cnt; i++) {
                dump_one(v[i]);
                printf("\n");
            }
        }
        bi_snapshot_list_free(v, cnt);
        break;
    }
    case SN_CREATE:
        ret = bi_snapshot_create(n, name, &err);
        break;
    case SN_APPLY:
        ret = bi_snapshot_apply(n, name, &err);
        break;
    case SN_DELETE:
        ret = bi_snapshot_delete(n, name, &err);
        break;
    }
    fflush(stdout);
    if (ret < 0) {
        tool_report(&err);
        ret = 1;
    }
    bi_error e2;
    bi_error_init(&e2);
    if (bi_close(n, &e2) < 0 && ret == 0) {
        tool_report(&e2);
        ret = 1;
    }
    return ret;
}
