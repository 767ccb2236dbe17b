/* SPDX-License-Identifier: MIT */
/*
 * A main for a fuzz target without libFuzzer: runs the target's
 * LLVMFuzzerTestOneInput once on each file named on the command line (a
 * directory: on each regular file in it but dot files, in name order). A
 * finding aborts, as under the fuzzer; otherwise prints "N inputs" and
 * exits 0. This is how `make check` replays the seed corpora and the
 * regression inputs with gcc, on the normal and on the sanitizer build.
 */
#include "fuzz_common.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Reads the whole of path (malloc'd; *size bytes), NULL on error. */
static uint8_t *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    size_t cap = 0, n = 0;

    if (!f)
        return NULL;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 65536;
            uint8_t *nb = realloc(buf, cap);
            if (!nb)
                abort();
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        if (!got)
            break;
        n += got;
    }
    fclose(f);
    *size = n;
    return buf;
}

/* Runs the target on one file; 0, or -1 if it cannot be read. */
static int run_file(const char *path)
{
    size_t size = 0;
    uint8_t *data = slurp(path, &size);

    if (!data) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        return -1;
    }
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, size);
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Runs the target on each regular file of dir; the count, or -1. */
static int run_dir(const char *dir)
{
    struct dirent **list;
    int n = scandir(dir, &list, NULL, by_name), count = 0;

    if (n < 0) {
        fprintf(stderr, "replay: cannot list %s\n", dir);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, list[i]->d_name);
        if (list[i]->d_name[0] != '.' && stat(path, &st) == 0 &&
            S_ISREG(st.st_mode)) {
            if (run_file(path) < 0)
                count = -1;
            else if (count >= 0)
                count++;
        }
        free(list[i]);
    }
    free(list);
    return count;
}

int main(int argc, char **argv)
{
    int total = 0;

    /* The targets change directory (fuzz_common.c): names go absolute. */
    for (int i = 1; i < argc; i++) {
        char *abs = realpath(argv[i], NULL);
        if (!abs) {
            fprintf(stderr, "replay: cannot find %s\n", argv[i]);
            return 1;
        }
        argv[i] = abs;
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;
        int n = stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)
                    ? run_dir(argv[i])
                    : (run_file(argv[i]) < 0 ? -1 : 1);
        if (n < 0)
            return 1;
        total += n;
        free(argv[i]);
    }
    printf("%d inputs\n", total);
    return 0;
}
