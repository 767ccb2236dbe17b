/* SPDX-License-Identifier: MIT */
/* Scratch files and opens for the fuzz targets (fuzz_common.h). */
#include "fuzz_common.h"

#include "block/block.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The external data file of every qcow2 image that has one. */
#define DATA_FILE "fuzz-data.img"

static char scratch[256];

/* Removes the scratch directory and what the targets left in it. */
static void scratch_remove(void)
{
    DIR *d = opendir(scratch);
    struct dirent *e;

    if (!d)
        return;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            (void)unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    (void)rmdir(scratch);
}

/* Makes the scratch directory: in $BLKIMG_FUZZ_DIR if set, else on tmpfs
 * when there is one. */
static void scratch_init(void)
{
    const char *bases[] = {getenv("BLKIMG_FUZZ_DIR"), "/dev/shm",
                           getenv("TMPDIR"), "/tmp"};

    if (scratch[0])
        return;
    for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
        if (!bases[i])
            continue;
        snprintf(scratch, sizeof(scratch), "%s/blkimg-fuzz-XXXXXX", bases[i]);
        if (mkdtemp(scratch))
            break;
        scratch[0] = 0;
    }
    FUZZ_ASSERT(scratch[0], "cannot make a scratch directory");
    atexit(scratch_remove);
}

/* Writes data to the scratch file name; its path (static slot). */
static const char *put_file(const char *name, const uint8_t *data, size_t size)
{
    static char paths[4][320];
    static const char *names[4];
    int slot = 0;

    scratch_init();
    while (slot < 3 && names[slot] && strcmp(names[slot], name))
        slot++;
    names[slot] = name;
    snprintf(paths[slot], sizeof(paths[slot]), "%s/%s", scratch, name);
    int fd = open(paths[slot], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FUZZ_ASSERT(fd >= 0, "cannot create %s", paths[slot]);
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, data + done, size - done);
        FUZZ_ASSERT(n > 0, "cannot write %s", paths[slot]);
        done += (size_t)n;
    }
    close(fd);
    return paths[slot];
}

const char *fuzz_put_image(const char *name, const uint8_t *data, size_t size)
{
    put_file(DATA_FILE, NULL, 0);
    return put_file(name, data, size);
}

/* The formats a target may open read-write: those whose images name no
 * other file (qcow2's data file is redirected, below). An image naming
 * files, such as a vmdk descriptor's extents, could make a write target
 * write any file the fuzzer guesses the name of. */
static bool writable(const struct bi_driver *drv)
{
    static const char *const names[] = {"raw", "qcow2", "vdi", "vpc", "vhdx"};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(drv->name, names[i]))
            return true;
    return false;
}

bi_node *fuzz_open(const char *path, bool read_write)
{
    /* Any data file a qcow2 image names becomes this one (an empty file
     * the image's clusters may grow; the node keeps the option array). */
    static char data_opt[320];
    static const char *const qcow2_opts[] = {data_opt, NULL};
    uint8_t head[BI_PROBE_BYTES] = {0};
    struct bi_open_opts o;
    bi_error err;

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    FUZZ_ASSERT(fd >= 0, "cannot open %s", path);
    FUZZ_ASSERT(pread(fd, head, sizeof(head), 0) >= 0, "cannot read %s", path);
    close(fd);
    bi_open_opts_init(&o);
    o.quiet_probe = true;
    o.no_backing = true;
    o.read_write = read_write;
    const struct bi_driver *drv = bi_probe_format(head, sizeof(head), path);
    if (read_write && !writable(drv))
        return NULL;
    if (drv == &bi_drv_qcow2) {
        snprintf(data_opt, sizeof(data_opt), "data-file=%s/%s", scratch,
                 DATA_FILE);
        o.driver_opts = qcow2_opts;
    }
    bi_error_init(&err);
    return bi_open(path, &o, &err);
}

FILE *fuzz_sink(void)
{
    static FILE *f;

    if (!f)
        f = fopen("/dev/null", "w");
    FUZZ_ASSERT(f, "cannot open /dev/null");
    return f;
}

void fuzz_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "%s:%d: fuzz assertion failed: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}
