/* SPDX-License-Identifier: MIT */
/*
 * The window QEMU's raw format makes with its offset and size options: a
 * node that shows bytes [offset, offset + size) of its file as bytes
 * [0, size). raw puts it under itself (driver=raw,offset=N) or in place
 * of another format's file (a vmdk inside an OVA).
 */
#ifndef BI_RAW_WINDOW_H
#define BI_RAW_WINDOW_H

#include "block/block.h"

/* The window's options as given: the values of "offset" and "size" (NULL
 * when absent; sizes with qemu's suffixes). */
struct raw_window_opts {
    const char *offset;
    const char *size;
};

/* Opens a window over child (taken: closed with the window; still the
 * caller's on failure) with QEMU 7.2's checks and words ("Offset (N) cannot be
 * greater than size of the containing file (M)"...). Named as QEMU names the
 * raw node: json:{"offset": ..., "driver": "raw", "size": ..., "file": ...}.
 * NULL with err set. */
bi_node *raw_window_open(bi_node *child, const struct raw_window_opts *wo,
                         const struct bi_open_opts *o, bi_error *err);

/* Whether n is a window node. */
bool raw_is_window(const bi_node *n);

#endif
