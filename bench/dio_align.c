/* SPDX-License-Identifier: MIT */
/*
 * Seed 000's experiment: COUNT sequential write(2) calls of SIZE bytes with
 * O_DIRECT, from a buffer whose address is ALIGN-aligned but (for ALIGN
 * below the page size) deliberately not page-aligned.
 *
 *   dio_align FILE ALIGN [COUNT [SIZE]]
 *
 * The file is opened as in the seed (O_RDWR | O_CREAT | O_DIRECT, no
 * truncation), so a first run allocates it and later runs overwrite the
 * same blocks. Prints the elapsed wall-clock seconds on stdout.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long parse(const char *s, const char *what)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno || *end || v <= 0) {
        fprintf(stderr, "dio_align: bad %s '%s'\n", what, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: dio_align FILE ALIGN [COUNT [SIZE]]\n");
        return 2;
    }
    const char *path = argv[1];
    long align = parse(argv[2], "alignment");
    long count = argc > 3 ? parse(argv[3], "count") : 100000;
    long size = argc > 4 ? parse(argv[4], "size") : 4096;
    long page = sysconf(_SC_PAGESIZE);

    if (align & (align - 1)) {
        fprintf(stderr, "dio_align: alignment must be a power of two\n");
        return 2;
    }
    /* A page-aligned block with room to shift the buffer by `align`, so
     * that for align < page the buffer is align-aligned and not
     * page-aligned. */
    void *mem;
    size_t slack = align < page ? (size_t)page : 0;
    if (posix_memalign(&mem, (size_t)page, (size_t)size + slack) != 0) {
        fprintf(stderr, "dio_align: out of memory\n");
        return 1;
    }
    char *buf = (char *)mem + (align < page ? align : 0);
    if (align < page && ((uintptr_t)buf % (uintptr_t)page) == 0) {
        fprintf(stderr, "dio_align: buffer unexpectedly page-aligned\n");
        return 1;
    }
    memset(buf, 0x11, (size_t)size);

    int fd = open(path, O_RDWR | O_CREAT | O_DIRECT, 0644);
    if (fd < 0) {
        fprintf(stderr, "dio_align: open '%s': %s\n", path, strerror(errno));
        return 1;
    }
    double t0 = now();
    for (long i = 0; i < count; i++) {
        ssize_t r = write(fd, buf, (size_t)size);
        if (r != size) {
            fprintf(stderr, "dio_align: write %ld of '%s': %s\n", i, path,
                    r < 0 ? strerror(errno) : "short write");
            close(fd);
            return 1;
        }
    }
    double t1 = now();
    close(fd);
    free(mem);
    printf("%.6f\n", t1 - t0);
    return 0;
}
