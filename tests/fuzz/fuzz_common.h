/* SPDX-License-Identifier: MIT */
/*
 * Shared helpers of the libFuzzer targets in tests/fuzz (and of their
 * replay build, replay_main.c). Every target defines
 * LLVMFuzzerTestOneInput; the helpers here give it a private scratch
 * directory, image files in it, and the open options all targets use.
 */
#ifndef BLKIMG_FUZZ_COMMON_H
#define BLKIMG_FUZZ_COMMON_H

#include "blkimg/blkimg.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Largest guest range a target reads or maps (images may claim any
 * virtual size; past this only the first FUZZ_MAX_GUEST bytes are used). */
#define FUZZ_MAX_GUEST (64ull << 20)

/* Writes data to the file name (no slash) in the process's scratch
 * directory (made on first use in $BLKIMG_FUZZ_DIR or on tmpfs, removed
 * at exit, though not after a crash), and empties the data
 * file fuzz_open gives qcow2 images. Returns the file's path (static storage:
 * valid until the next call with another name). Aborts on error. */
const char *fuzz_put_image(const char *name, const uint8_t *data, size_t size);

/* Opens path as the targets do: format probed, no backing files, quiet,
 * read_write as asked. A qcow2 image naming an external data file gets
 * one inside the scratch directory instead of the name it carries, and
 * only formats whose images name no other file (raw, qcow2, vdi, vpc)
 * open read-write, so that no input can make a target write a file
 * elsewhere. NULL when the library refuses the image (or the target may
 * not open it so). */
bi_node *fuzz_open(const char *path, bool read_write);

/* /dev/null as a stream, for printers whose text only has to be made. */
FILE *fuzz_sink(void);

/* Aborts (a finding for the fuzzer) with a message when cond is false. */
#define FUZZ_ASSERT(cond, ...)                                                 \
    do {                                                                       \
        if (!(cond))                                                           \
            fuzz_fail(__FILE__, __LINE__, __VA_ARGS__);                        \
    } while (0)
_Noreturn void fuzz_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
