/* SPDX-License-Identifier: MIT */
/*
 * blkimg map --output=svg: the allocation of an image drawn to scale, for
 * the operator asking "why is this image so big". One row per layer of the
 * backing chain (depth 0, the image itself, at the top) shows where that
 * layer supplies data, compressed data or zeroes; a last row shows what no
 * layer allocates. Positions and widths are proportional to guest offsets
 * and lengths; every extent carries its numbers as data-* attributes and a
 * tooltip, so that scripts and tests can read the picture back.
 */
#include "img_map_svg.h"

#include "blkimg/blkimg.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Geometry, in SVG user units (pixels). */
enum {
    SVG_WIDTH = 1000,
    BAR_LEFT = 220, /* the label column is left of it */
    BAR_WIDTH = 740,
    FIRST_ROW_Y = 64,
    ROW_HEIGHT = 32,
    ROW_GAP = 10,
    LABEL_MAX = 30, /* characters of a file name shown (all in the tooltip) */
};

static const char *const kind_name[] = {
    [MAP_DATA] = "data",
    [MAP_ZERO] = "zero",
    [MAP_COMPRESSED] = "compressed",
    [MAP_UNALLOCATED] = "unallocated",
};
#define N_KINDS 4

int map_extents_add(struct map_extents *x, const struct map_extent *e)
{
    if (x->n == x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 64;
        struct map_extent *v = realloc(x->v, cap * sizeof(*v));
        if (!v) {
            return -ENOMEM;
        }
        x->v = v;
        x->cap = cap;
    }
    x->v[x->n++] = *e;
    return 0;
}

void map_extents_free(struct map_extents *x)
{
    free(x->v);
    *x = (struct map_extents){0};
}

/* Writes s with XML's special characters escaped (text and attributes). */
static void xml_put(FILE *out, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&':
            fputs("&amp;", out);
            break;
        case '<':
            fputs("&lt;", out);
            break;
        case '>':
            fputs("&gt;", out);
            break;
        case '"':
            fputs("&quot;", out);
            break;
        default:
            putc(*s, out);
        }
    }
}

/* Writes at most LABEL_MAX characters of name: its end, after "...", when
 * it is longer (the end of a path says most). */
static void xml_put_short(FILE *out, const char *name)
{
    size_t len = strlen(name);
    if (len > LABEL_MAX) {
        fputs("...", out);
        name += len - (LABEL_MAX - 3);
    }
    xml_put(out, name);
}

static const char *human(uint64_t v, char *buf, size_t len)
{
    bi_format_size(v, buf, len);
    return buf;
}

/* The x coordinate of guest offset off on the bar of [start, end). */
static double x_of(int64_t off, int64_t start, int64_t end)
{
    if (end <= start) {
        return BAR_LEFT;
    }
    return BAR_LEFT + (double)(off - start) * BAR_WIDTH / (double)(end - start);
}

/* The row where an extent is drawn: its layer, or the last row (after
 * every layer) when nothing allocates it. */
static int row_of(const struct map_extent *e, int n_layers)
{
    return e->kind == MAP_UNALLOCATED ? n_layers : e->depth;
}

static int row_y(int row)
{
    return FIRST_ROW_Y + row * (ROW_HEIGHT + ROW_GAP);
}

/* Bytes of each kind in row row (row < 0: in every row). */
static void totals(const struct map_extents *x, int n_layers, int row,
                   uint64_t sum[N_KINDS])
{
    memset(sum, 0, N_KINDS * sizeof(sum[0]));
    for (size_t i = 0; i < x->n; i++) {
        if (row < 0 || row_of(&x->v[i], n_layers) == row) {
            sum[x->v[i].kind] += (uint64_t)x->v[i].length;
        }
    }
}

static void write_head(FILE *out, const char *filename, int64_t start,
                       int64_t end, int height)
{
    char a[32], b[32];
    fprintf(out,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
            "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
            "<style>\n"
            "  .data { fill: #1f77b4; }\n"
            "  .compressed { fill: #ff7f0e; }\n"
            "  .zero { fill: #a6d38e; }\n"
            "  .unallocated { fill: #d9d9d9; }\n"
            "  .row { fill: #ffffff; stroke: #888888; stroke-width: 0.5; }\n"
            "  text { font-size: 12px; fill: #222222; }\n"
            "  .small { font-size: 10px; fill: #555555; }\n"
            "</style>\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n",
            SVG_WIDTH, height, SVG_WIDTH, height);
    fputs("<text x=\"10\" y=\"22\" style=\"font-size: 15px; "
          "font-weight: bold\">blkimg map: ",
          out);
    xml_put(out, filename);
    fputs("</text>\n", out);
    fprintf(out,
            "<text class=\"small\" x=\"10\" y=\"40\">guest range %" PRId64
            " to %" PRId64 " (%s from %s), drawn to scale; one row per layer "
            "of the backing chain</text>\n",
            start, end, human((uint64_t)(end - start), a, sizeof(a)),
            human((uint64_t)start, b, sizeof(b)));
}

/* The label column and the empty bar of row row. */
static void write_row_frame(FILE *out, int row, const char *label,
                            const char *format, const uint64_t sum[N_KINDS])
{
    char buf[32];
    int y = row_y(row);
    fprintf(out, "<g class=\"layer\" data-row=\"%d\"><title>", row);
    xml_put(out, label);
    fputs("</title>\n", out);
    fprintf(out, "<text x=\"10\" y=\"%d\">", y + 13);
    if (format) {
        fprintf(out, "%d: ", row);
    }
    xml_put_short(out, label);
    if (format) {
        fputs(" (", out);
        xml_put(out, format);
        putc(')', out);
    }
    fputs("</text>\n", out);
    fprintf(out, "<text class=\"small\" x=\"10\" y=\"%d\">", y + 27);
    bool first = true;
    for (int k = 0; k < N_KINDS; k++) {
        if (sum[k]) {
            fprintf(out, "%s%s %s", first ? "" : ", ", kind_name[k],
                    human(sum[k], buf, sizeof(buf)));
            first = false;
        }
    }
    fputs(first ? "nothing</text>\n" : "</text>\n", out);
    fprintf(out,
            "<rect class=\"row\" x=\"%d\" y=\"%d\" width=\"%d\" "
            "height=\"%d\"/>\n</g>\n",
            BAR_LEFT, y, BAR_WIDTH, ROW_HEIGHT);
}

static void write_extent(FILE *out, const struct map_extent *e, int n_layers,
                         int64_t start, int64_t end)
{
    char buf[32];
    double x0 = x_of(e->start, start, end);
    double x1 = x_of(e->start + e->length, start, end);
    fprintf(out,
            "<rect class=\"extent %s\" x=\"%.3f\" y=\"%d\" width=\"%.3f\" "
            "height=\"%d\" data-start=\"%" PRId64 "\" data-length=\"%" PRId64
            "\" data-depth=\"%d\" data-kind=\"%s\">",
            kind_name[e->kind], x0, row_y(row_of(e, n_layers)) + 1, x1 - x0,
            ROW_HEIGHT - 2, e->start, e->length, e->depth, kind_name[e->kind]);
    fprintf(out,
            "<title>%s at %" PRId64 ", %" PRId64 " bytes (%s), depth "
            "%d</title></rect>\n",
            kind_name[e->kind], e->start, e->length,
            human((uint64_t)e->length, buf, sizeof(buf)), e->depth);
}

/* Tick marks at every quarter of the range, labelled with offsets. */
static void write_axis(FILE *out, int y, int64_t start, int64_t end)
{
    char buf[32];
    fprintf(out,
            "<g class=\"axis\">\n<line x1=\"%d\" y1=\"%d\" x2=\"%d\" "
            "y2=\"%d\" stroke=\"#444444\"/>\n",
            BAR_LEFT, y, BAR_LEFT + BAR_WIDTH, y);
    for (int q = 0; q <= 4; q++) {
        int64_t off = start + (int64_t)((double)(end - start) * q / 4);
        double x = x_of(off, start, end);
        const char *anchor = q == 0 ? "start" : q == 4 ? "end" : "middle";
        fprintf(out,
                "<line x1=\"%.3f\" y1=\"%d\" x2=\"%.3f\" y2=\"%d\" "
                "stroke=\"#444444\"/>\n<text class=\"small\" x=\"%.3f\" "
                "y=\"%d\" text-anchor=\"%s\">%s</text>\n",
                x, y, x, y + 5, x, y + 17, anchor,
                human((uint64_t)off, buf, sizeof(buf)));
    }
    fputs("</g>\n", out);
}

/* Swatches of the kinds with their totals and share of the range. */
static void write_legend(FILE *out, int y, const uint64_t sum[N_KINDS],
                         int64_t start, int64_t end)
{
    char buf[32];
    fputs("<g class=\"legend\">\n", out);
    for (int k = 0; k < N_KINDS; k++) {
        int x = 10 + k * 245;
        double pct =
            end > start ? 100.0 * (double)sum[k] / (double)(end - start) : 0.0;
        fprintf(out,
                "<rect class=\"%s\" x=\"%d\" y=\"%d\" width=\"14\" "
                "height=\"14\"/>\n<text x=\"%d\" y=\"%d\">%s: %s "
                "(%.1f%%)</text>\n",
                kind_name[k], x, y, x + 20, y + 12, kind_name[k],
                human(sum[k], buf, sizeof(buf)), pct);
    }
    fputs("</g>\n", out);
}

int map_svg_write(FILE *out, const char *filename, int64_t start, int64_t end,
                  const struct map_layer *layers, int n_layers,
                  const struct map_extents *x)
{
    uint64_t sum[N_KINDS];
    int rows = n_layers + 1;
    int axis_y = row_y(rows) + 4;
    int legend_y = axis_y + 32;

    write_head(out, filename, start, end, legend_y + 28);
    for (int r = 0; r < rows; r++) {
        totals(x, n_layers, r, sum);
        if (r < n_layers) {
            write_row_frame(out, r, layers[r].filename, layers[r].format, sum);
        } else {
            write_row_frame(out, r, "allocated in no layer", NULL, sum);
        }
    }
    fputs("<g class=\"extents\">\n", out);
    for (size_t i = 0; i < x->n; i++) {
        write_extent(out, &x->v[i], n_layers, start, end);
    }
    fputs("</g>\n", out);
    write_axis(out, axis_y, start, end);
    totals(x, n_layers, -1, sum);
    write_legend(out, legend_y, sum, start, end);
    fputs("</svg>\n", out);
    return ferror(out) ? -EIO : 0;
}
