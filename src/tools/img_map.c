/* SPDX-License-Identifier: MIT */
/* blkimg map: qemu-img 7.2's "map" (human and JSON, start/length), and
 * blkimg's own --output=svg (img_map_svg.c). */
#include "common.h"
#include "img.h"
#include "img_map_svg.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct map_entry {
    int64_t start, length;
    bool data, zero, present, has_offset;
    bool compressed; /* told apart by the SVG only, as qemu-img has no key */
    int64_t offset;
    int depth;
    const char *filename; /* NULL when there is no offset */
};

static int get_block_status(bi_node *n, int64_t offset, int64_t bytes,
                            struct map_entry *e)
{
    struct bi_status st;
    int ret =
        bi_block_status_above(n, NULL, (uint64_t)offset, (uint64_t)bytes, &st);
    if (ret < 0) {
        return ret;
    }
    if (st.len == 0) {
        return -EIO;
    }
    bool has_offset = (st.flags & BI_BS_OFFSET_VALID) != 0;
    *e = (struct map_entry){
        .start = offset,
        .length = (int64_t)st.len,
        .data = (st.flags & BI_BS_DATA) != 0,
        .zero = (st.flags & BI_BS_ZERO) != 0,
        .offset = (int64_t)st.offset,
        .has_offset = has_offset,
        .depth = st.depth,
        .present = (st.flags & BI_BS_ALLOCATED) != 0,
        .compressed = (st.flags & BI_BS_COMPRESSED) != 0,
        .filename = has_offset && st.file ? bi_node_filename(st.file) : NULL,
    };
    return 0;
}

/* Whether next continues curr as one entry of qemu-img's output (and, with
 * by_compression, of the same compression too). */
static bool entry_mergeable(const struct map_entry *curr,
                            const struct map_entry *next, bool by_compression)
{
    if (curr->length == 0) {
        return false;
    }
    if (by_compression && curr->compressed != next->compressed) {
        return false;
    }
    if (curr->zero != next->zero || curr->data != next->data ||
        curr->depth != next->depth || curr->present != next->present ||
        !curr->filename != !next->filename ||
        curr->has_offset != next->has_offset) {
        return false;
    }
    if (curr->filename && strcmp(curr->filename, next->filename)) {
        return false;
    }
    if (curr->has_offset && curr->offset + curr->length != next->offset) {
        return false;
    }
    return true;
}

static int dump_map_entry(enum tool_output of, const struct map_entry *e,
                          struct map_entry *next)
{
    if (of == TOOL_OUTPUT_HUMAN) {
        if (e->data && !e->has_offset) {
            tool_error("File contains external, encrypted or compressed "
                       "clusters.");
            return -1;
        }
        if (e->data && !e->zero) {
            printf("%#-16" PRIx64 "%#-16" PRIx64 "%#-16" PRIx64 "%s\n",
                   (uint64_t)e->start, (uint64_t)e->length,
                   (uint64_t)(e->has_offset ? e->offset : 0),
                   e->filename ? e->filename : "");
        }
        /* The human format does not tell zero from unallocated: let them
         * coalesce. */
        if (next && (!next->data || next->zero)) {
            next->data = false;
            next->zero = true;
        }
    } else {
        printf("{ \"start\": %" PRId64 ", \"length\": %" PRId64
               ", \"depth\": %d, \"present\": %s, \"zero\": %s, \"data\": %s",
               e->start, e->length, e->depth, e->present ? "true" : "false",
               e->zero ? "true" : "false", e->data ? "true" : "false");
        if (e->has_offset) {
            printf(", \"offset\": %" PRId64, e->offset);
        }
        putchar('}');
        if (next) {
            puts(",");
        }
    }
    return 0;
}

/* Where the entries go: printed as they come (human, JSON), or collected
 * for the SVG drawn at the end. */
struct map_sink {
    enum tool_output of;
    bool svg;
    struct map_extents extents;
};

static enum map_kind entry_kind(const struct map_entry *e)
{
    if (!e->present) {
        return MAP_UNALLOCATED;
    }
    if (e->zero) {
        return MAP_ZERO;
    }
    return e->compressed ? MAP_COMPRESSED : MAP_DATA;
}

/* Passes one finished entry e (next: the one after it, or NULL at the end)
 * to the sink. Returns 0 or -1 after printing an error. */
static int sink_entry(struct map_sink *s, const struct map_entry *e,
                      struct map_entry *next)
{
    if (!s->svg) {
        return dump_map_entry(s->of, e, next);
    }
    if (e->length == 0) {
        return 0;
    }
    struct map_extent x = {e->start, e->length, e->depth, entry_kind(e)};
    if (map_extents_add(&s->extents, &x) < 0) {
        tool_error("%s", strerror(ENOMEM));
        return -1;
    }
    return 0;
}

/* Draws the collected extents of [start, end) of n (the top of its chain)
 * on stdout. Returns 0 or -1 after printing an error. */
static int sink_svg(struct map_sink *s, bi_node *n, const char *filename,
                    int64_t start, int64_t end)
{
    int n_layers = 0;
    for (bi_node *l = n; l; l = bi_node_backing(l)) {
        n_layers++;
    }
    struct map_layer *layers = calloc((size_t)n_layers, sizeof(*layers));
    if (!layers) {
        tool_error("%s", strerror(ENOMEM));
        return -1;
    }
    int i = 0;
    for (bi_node *l = n; l; l = bi_node_backing(l), i++) {
        layers[i] = (struct map_layer){bi_node_filename(l), bi_node_format(l)};
    }
    int ret = map_svg_write(stdout, filename, start, end, layers, n_layers,
                            &s->extents);
    free(layers);
    if (ret < 0) {
        tool_error("Could not write the map: %s", strerror(-ret));
        return -1;
    }
    return 0;
}

int img_map(int argc, char **argv)
{
    static const struct option long_options[] = {
        {"help", no_argument, 0, 'h'},
        {"format", required_argument, 0, 'f'},
        {"output", required_argument, 0, 256},
        {"object", required_argument, 0, 257},
        {"image-opts", no_argument, 0, 258},
        {"force-share", no_argument, 0, 'U'},
        {"start-offset", required_argument, 0, 's'},
        {"max-length", required_argument, 0, 'l'},
        {0, 0, 0, 0},
    };
    const char *fmt = NULL, *output = NULL;
    bool image_opts = false, force_share = false;
    int64_t start_offset = 0, max_length = -1;
    struct map_sink sink = {.of = TOOL_OUTPUT_HUMAN};
    int c, ret = 0;

    opterr = 0;
    while ((c = getopt_long(argc, argv, ":f:s:l:hU", long_options, NULL)) !=
           -1) {
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
        case 's':
            start_offset = tool_cvtnum("start offset", optarg);
            if (start_offset < 0) {
                return 1;
            }
            break;
        case 'l':
            max_length = tool_cvtnum("max length", optarg);
            if (max_length < 0) {
                return 1;
            }
            break;
        case 257:
            if (tool_object_add(optarg) < 0) {
                return 1;
            }
            break;
        case 258:
            image_opts = true;
            break;
        }
    }
    if (optind != argc - 1) {
        tool_error_exit("Expecting one image file name");
    }
    const char *filename = argv[optind];
    sink.svg = output && !strcmp(output, "svg");
    if (!sink.svg && tool_parse_output(output, &sink.of) < 0) {
        return 1;
    }

    struct tool_image ti;
    tool_image_init(&ti);
    ti.filename = filename;
    ti.fmt = fmt;
    ti.image_opts = image_opts;
    ti.force_share = force_share;
    ti.quiet_probe = true;
    bi_node *n = tool_open(&ti);
    if (!n) {
        return 1;
    }

    if (sink.svg) {
        /* drawn at the end */
    } else if (sink.of == TOOL_OUTPUT_HUMAN) {
        printf("%-16s%-16s%-16s%s\n", "Offset", "Length", "Mapped to", "File");
    } else {
        putchar('[');
    }

    int64_t length = bi_getlength(n);
    if (length < 0) {
        tool_error("Failed to get size for '%s'", filename);
        bi_close(n, NULL);
        return 1;
    }
    if (max_length != -1) {
        /* both are at most INT64_MAX: no overflow in unsigned */
        uint64_t end = (uint64_t)start_offset + (uint64_t)max_length;
        if (end < (uint64_t)length) {
            length = (int64_t)end;
        }
    }

    struct map_entry curr = {.start = start_offset, .length = 0}, next;
    while (curr.start + curr.length < length) {
        int64_t offset = curr.start + curr.length;
        int64_t len = length - offset;

        ret = get_block_status(n, offset, len, &next);
        if (ret < 0) {
            tool_error("Could not read file metadata: %s", strerror(-ret));
            goto out;
        }
        if (entry_mergeable(&curr, &next, sink.svg)) {
            curr.length += next.length;
            continue;
        }
        if (curr.length > 0) {
            ret = sink_entry(&sink, &curr, &next);
            if (ret < 0) {
                goto out;
            }
        }
        curr = next;
    }
    ret = sink_entry(&sink, &curr, NULL);
    if (ret == 0 && sink.svg) {
        ret = sink_svg(&sink, n, filename, start_offset,
                       length > start_offset ? length : start_offset);
    } else if (sink.of == TOOL_OUTPUT_JSON) {
        puts("]");
    }
out:
    map_extents_free(&sink.extents);
    bi_close(n, NULL);
    return ret < 0;
}
