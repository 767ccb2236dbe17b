/* SPDX-License-Identifier: MIT */
/* blkimg map --output=svg: an image's allocation drawn to scale, one row per
 * layer of the backing chain (img_map_svg.c). */
#ifndef BI_TOOLS_IMG_MAP_SVG_H
#define BI_TOOLS_IMG_MAP_SVG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* What a guest range reads as, and from where. */
enum map_kind {
    MAP_DATA,        /* data in the layer at its depth */
    MAP_ZERO,        /* reads as zeroes (zero clusters, holes) */
    MAP_COMPRESSED,  /* compressed data */
    MAP_UNALLOCATED, /* allocated in no layer */
};

/* One extent, as one entry of `map --output=json` (same start, length and
 * depth). */
struct map_extent {
    int64_t start, length;
    int depth;
    enum map_kind kind;
};

/* The extents in guest order; map_extents_add() grows the array. */
struct map_extents {
    struct map_extent *v;
    size_t n, cap;
};

/* Appends e; returns 0 or -ENOMEM. */
int map_extents_add(struct map_extents *x, const struct map_extent *e);
void map_extents_free(struct map_extents *x);

/* A layer of the chain: depth 0 is the image itself, 1 its backing file... */
struct map_layer {
    const char *filename;
    const char *format;
};

/* Writes the SVG document of extents x of the guest range [start, end) to
 * out: one row per layer (n_layers >= 1) holding the extents found at that
 * depth, a last row for unallocated ones, an axis in bytes and a legend
 * with the total of each kind. Every extent is a <rect> whose x and width
 * are its start and length to scale, carrying data-start, data-length,
 * data-depth and data-kind. Preconditions: start <= end, extents sorted
 * and within [start, end), depths < n_layers. Returns 0 or -errno of the
 * write. */
int map_svg_write(FILE *out, const char *filename, int64_t start, int64_t end,
                  const struct map_layer *layers, int n_layers,
                  const struct map_extents *x);

#endif
