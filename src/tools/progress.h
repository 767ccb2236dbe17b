/* SPDX-License-Identifier: MIT */
/*
 * Progress output of the blkimg subcommands: qemu-img's -p lines, a bar,
 * or JSON lines (progress.c). The library reports progress through
 * callbacks; printing it is the tools' business.
 */
#ifndef BI_TOOLS_PROGRESS_H
#define BI_TOOLS_PROGRESS_H

#include "blkimg/convert.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* ---------------------------------------------------------- progress */

enum bi_progress_mode {
    BI_PROGRESS_NONE = 0,
    BI_PROGRESS_QEMU, /* "    (NN.NN/100%)\r" lines, as qemu-img -p */
    BI_PROGRESS_BAR,  /* a bar with rate and time left (stderr if tty) */
    BI_PROGRESS_JSON, /* one JSON object a line */
};

struct bi_progress {
    enum bi_progress_mode mode;
    FILE *out;
    float current; /* percent, qemu's float arithmetic */
    float last_print;
    float min_skip;
    uint64_t start_ns;
    uint64_t last_ns;
    uint64_t done, total; /* bytes, for bar and json */
    const char *op;       /* operation name for json ("convert") */
};

/* Parses "qemu", "bar", "json" (--progress=MODE). */
int bi_progress_parse(const char *s, enum bi_progress_mode *out);
void bi_progress_init(struct bi_progress *p, enum bi_progress_mode mode,
                      float min_skip, const char *op);
/* qemu_progress_print(): with max == 0 delta is the absolute percentage,
 * else a delta as fraction of max percent. */
void bi_progress_print(struct bi_progress *p, float delta, int max);
/* Byte counts for the extended modes (and percentage for all). */
void bi_progress_bytes(struct bi_progress *p, uint64_t done, uint64_t total);
void bi_progress_end(struct bi_progress *p);
/* A bi_convert_progress_cb driving a struct bi_progress. */
void bi_progress_convert_cb(void *opaque, uint64_t done, uint64_t total);

#endif
