/* SPDX-License-Identifier: MIT */
/*
 * blkimg bench: qemu-img 7.2's "bench": COUNT requests of BUFSIZE bytes,
 * DEPTH in flight, at OFFSET, OFFSET+STEP, ... (wrapping at the image
 * size), optionally flushing every N requests.
 *
 * Extensions: --random[=SEED] sends each request to a random multiple of
 * the step in [offset, image size); --stats prints the protocol node's
 * I/O counters after the run; --object defines a secret, so that an
 * encrypted image can be measured.
 *
 * The submission loop allocates nothing: the DEPTH request slots (buffer
 * and iovec each) are set up once and reused.
 */
#include "common.h"
#include "img.h"
#include "util/util.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct bench_slot {
    struct iovec iov;
    struct bench *b;
};

struct bench {
    bi_node *node;
    int64_t image_size;
    int bufsize;
    int step;
    int nrreq; /* depth */
    int n;     /* requests not yet completed */
    int in_flight;
    int64_t offset; /* next offset (sequential mode) */
    bool write;
    int flush_interval;
    bool drain_on_flush;
    bool in_flush;
    int error; /* first failure: no more requests are sent */
    /* random mode */
    bool random;
    uint64_t rng;
    int64_t rand_base;
    uint64_t rand_slots;
    /* free slots (a stack) */
    struct bench_slot *slots;
    struct bench_slot **free_slots;
    int n_free;
};

static void req_cb(void *opaque, int ret);
static void submit(struct bench *b);

/* xorshift64*: fast and fixed by the seed. */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* qemu-img exits at the first failure; we stop sending, let what is in
 * flight complete and then fail (same output). */
static void fail(struct bench *b, const char *what, int ret)
{
    if (!b->error) {
        tool_error("%s: %s", what, strerror(-ret));
        b->error = ret;
    }
}

static void bench_undrained_flush_cb(void *opaque, int ret)
{
    if (ret < 0) {
        fail(opaque, "Failed flush request", ret);
    }
}

static void bench_flush_cb(void *opaque, int ret)
{
    struct bench *b = opaque;
    if (ret < 0) {
        fail(b, "Failed request", ret);
    }
    /* the queue was drained for this flush: go on */
    b->in_flush = false;
    submit(b);
}

static void submit(struct bench *b)
{
    while (!b->error && b->n > b->in_flight && b->in_flight < b->nrreq) {
        int64_t offset;
        struct bench_slot *s = b->free_slots[--b->n_free];

        if (b->random) {
            offset = b->rand_base +
                     (int64_t)(rng_next(&b->rng) % b->rand_slots) * b->step;
        } else {
            offset = b->offset;
            b->offset += b->step;
            b->offset %= b->image_size;
        }
        /* the completion may run before the call returns: count first */
        b->in_flight++;
        if (b->write) {
            bi_aio_pwritev(b->node, (uint64_t)offset, &s->iov, 1, 0, req_cb, s);
        } else {
            bi_aio_preadv(b->node, (uint64_t)offset, &s->iov, 1, req_cb, s);
        }
    }
}

/* A request completed: account, flush when due, send the next ones. */
static void req_cb(void *opaque, int ret)
{
    struct bench_slot *s = opaque;
    struct bench *b = s->b;
    int remaining;

    if (ret < 0) {
        fail(b, "Failed request", ret);
    }
    remaining = b->n - b->in_flight; /* not yet sent */
    b->free_slots[b->n_free++] = s;
    b->n--;
    b->in_flight--;
    if (b->flush_interval && remaining % b->flush_interval == 0 && !b->error) {
        /* with draining, the flush waits until nothing is in flight, and
         * nothing is sent until it completes */
        if (!b->in_flight || !b->drain_on_flush) {
            if (b->drain_on_flush) {
                b->in_flush = true;
                bi_aio_flush(b->node, bench_flush_cb, b);
            } else {
                bi_aio_flush(b->node, bench_undrained_flush_cb, b);
            }
        }
        if (b->drain_on_flush) {
            return;
        }
    }
    submit(b);
}

static void print_stats(bi_node *n)
{
    bi_node *file = bi_node_file(n);
    struct bi_stats st;

    if (!file) {
        file = n;
    }
    bi_node_stats(file, &st);
    printf("stats for '%s' (protocol node):\n", bi_node_filename(file));
    printf("  io calls: %" PRIu64 "\n", st.io_calls);
    printf("  bytes read: %" PRIu64 "\n", st.bytes_read);
    printf("  bytes written: %" PRIu64 "\n", st.bytes_written);
    printf("  bounced bytes: %" PRIu64 "\n", st.bounced_bytes);
    printf("  rmw operations: %" PRIu64 "\n", st.rmw_ops);
    printf("  serialised waits: %" PRIu64 "\n", st.serialised_waits);
}

enum {
    OPT_PATTERN = 256,
    OPT_FLUSH_INTERVAL,
    OPT_NO_DRAIN,
    OPT_IMAGE_OPTS,
    OPT_RANDOM,
    OPT_STATS,
    OPT_OBJECT,
};

int img_bench(int argc, char **argv)
{
    static const struct option long_options[] = {
        {"help", no_argument, 0, 'h'},
        {"flush-interval", required_argument, 0, OPT_FLUSH_INTERVAL},
        {"image-opts", no_argument, 0, OPT_IMAGE_OPTS},
        {"pattern", required_argument, 0, OPT_PATTERN},
        {"no-drain", no_argument, 0, OPT_NO_DRAIN},
        {"force-share", no_argument, 0, 'U'},
        {"random", optional_argument, 0, OPT_RANDOM},
        {"stats", no_argument, 0, OPT_STATS},
        /* not in qemu-img 7.2's bench: a secret for an encrypted image */
        {"object", required_argument, 0, OPT_OBJECT},
        {0, 0, 0, 0},
    };
    const char *fmt = NULL, *filename;
    bool image_opts = false, is_write = false, force_share = false;
    bool stats = false, random = false, native = false, uring = false;
    int count = 75000, depth = 64, pattern = 0, flush_interval = 0;
    int64_t offset = 0;
    int bufsize = 4096, step = 0;
    bool drain_on_flush = true;
    uint64_t seed = 1;
    enum bi_cache cache = BI_CACHE_WRITEBACK;
    enum bi_aio aio = BI_AIO_DEFAULT;
    bool aio_set = false;
    int c, ret = 1;

    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hc:d:f:ni:o:qs:S:t:wU", long_options,
                            NULL)) != -1) {
        switch (c) {
        case ':':
        case '?':
            tool_getopt_error(c, argv);
        case 'h':
            img_help();
        case 'c': {
            unsigned long res;
            if (tool_strtoul(optarg, &res) < 0 || res > INT_MAX) {
                tool_error("Invalid request count specified");
                return 1;
            }
            count = (int)res;
            break;
        }
        case 'd': {
            unsigned long res;
            /* qemu-img 7.2 accepts 0 and then never completes: refused */
            if (tool_strtoul(optarg, &res) < 0 || res > INT_MAX || !res) {
                tool_error("Invalid queue depth specified");
                return 1;
            }
            depth = (int)res;
            break;
        }
        case 'f':
            fmt = optarg;
            break;
        case 'n':
            native = true;
            break;
        case 'i': {
            enum bi_aio a;
            if (bi_aio_parse(optarg, &a) < 0) {
                tool_error("Invalid aio option: %s", optarg);
                return 1;
            }
            /* as qemu's flags: native wins over io_uring over threads,
             * whatever the order */
            if (a == BI_AIO_NATIVE) {
                native = true;
            } else if (a == BI_AIO_IO_URING) {
                uring = true;
            } else {
                aio_set = true;
                aio = BI_AIO_THREADS;
            }
            break;
        }
        case 'o': {
            offset = tool_cvtnum("offset", optarg);
            if (offset < 0) {
                return 1;
            }
            break;
        }
        case 'q':
            /* qemu-img bench prints its lines even with -q */
            break;
        case 's': {
            int64_t sval = tool_cvtnum_full("buffer size", optarg, 0, INT_MAX);
            if (sval < 0) {
                return 1;
            }
            bufsize = (int)sval;
            break;
        }
        case 'S': {
            int64_t sval = tool_cvtnum_full("step_size", optarg, 0, INT_MAX);
            if (sval < 0) {
                return 1;
            }
            step = (int)sval;
            break;
        }
        case 't':
            if (bi_cache_parse(optarg, &cache) < 0) {
                tool_error("Invalid cache mode");
                return 1;
            }
            break;
        case 'w':
            is_write = true;
            break;
        case 'U':
            force_share = true;
            break;
        case OPT_OBJECT:
            if (tool_object_add(optarg) < 0)
                return 1;
            break;
        case OPT_PATTERN: {
            unsigned long res;
            if (tool_strtoul(optarg, &res) < 0 || res > 0xff) {
                tool_error("Invalid pattern byte specified");
                return 1;
            }
            pattern = (int)res;
            break;
        }
        case OPT_FLUSH_INTERVAL: {
            unsigned long res;
            if (tool_strtoul(optarg, &res) < 0 || res > INT_MAX) {
                tool_error("Invalid flush interval specified");
                return 1;
            }
            flush_interval = (int)res;
            break;
        }
        case OPT_NO_DRAIN:
            drain_on_flush = false;
            break;
        case OPT_IMAGE_OPTS:
            image_opts = true;
            break;
        case OPT_RANDOM:
            random = true;
            if (optarg) {
                unsigned long res;
                if (tool_strtoul(optarg, &res) < 0) {
                    tool_error("Invalid random seed specified");
                    return 1;
                }
                seed = res;
            }
            break;
        case OPT_STATS:
            stats = true;
            break;
        }
    }
    if (optind != argc - 1) {
        tool_error_exit("Expecting one image file name");
    }
    filename = argv[argc - 1];

    if (native || uring) {
        aio = native ? BI_AIO_NATIVE : BI_AIO_IO_URING;
        aio_set = true;
    }
    if (!is_write && flush_interval) {
        tool_error("--flush-interval is only available in write tests");
        return 1;
    }
    if (flush_interval && flush_interval < depth) {
        tool_error("Flush interval can't be smaller than depth");
        return 1;
    }

    struct tool_image ti;
    tool_image_init(&ti);
    ti.filename = filename;
    ti.fmt = fmt;
    ti.image_opts = image_opts;
    ti.cache = cache;
    ti.cache_set = true;
    ti.read_write = is_write;
    ti.force_share = force_share;
    ti.aio_set = aio_set;
    ti.aio = aio;
    bi_node *node = tool_open(&ti);
    if (!node) {
        return 1;
    }
    int64_t image_size = bi_getlength(node);
    if (image_size < 0) {
        tool_error("Could not get the image size: %s",
                   strerror((int)-image_size));
        goto out;
    }

    struct bench b;
    memset(&b, 0, sizeof(b));
    b.node = node;
    b.image_size = image_size;
    b.bufsize = bufsize;
    b.step = step ? step : bufsize;
    b.nrreq = depth;
    b.n = count;
    b.offset = offset;
    b.write = is_write;
    b.flush_interval = flush_interval;
    b.drain_on_flush = drain_on_flush;

    if (random) {
        b.random = true;
        b.rng = seed ? seed : 0x9E3779B97F4A7C15ULL;
        b.rand_base = offset;
        if (b.step <= 0 || offset + bufsize > image_size) {
            tool_error("--random needs a step size above 0 and room for one "
                       "request between the offset and the image end");
            goto out;
        }
        b.rand_slots =
            (uint64_t)(image_size - offset - bufsize) / (uint64_t)b.step + 1;
        printf("Sending %d %s requests, %d bytes each, %d in parallel "
               "(random offsets in [%" PRId64 ", %" PRId64
               "), step size %d, seed %" PRIu64 ")\n",
               b.n, b.write ? "write" : "read", b.bufsize, b.nrreq, offset,
               image_size, b.step, seed);
    } else {
        printf("Sending %d %s requests, %d bytes each, %d in parallel "
               "(starting at offset %" PRId64 ", step size %d)\n",
               b.n, b.write ? "write" : "read", b.bufsize, b.nrreq, b.offset,
               b.step);
    }
    if (flush_interval) {
        printf("Sending flush every %d requests\n", flush_interval);
    }

    /* One buffer per slot, from the node's optimal alignment. */
    size_t total = (size_t)b.nrreq * (size_t)b.bufsize;
    uint8_t *buf = bi_blockalign(node, total ? total : 1);
    if (!buf) {
        tool_error("Could not allocate %zu bytes of buffers", total);
        goto out;
    }
    memset(buf, pattern, total);
    b.slots = bi_xzalloc(sizeof(*b.slots) * (size_t)b.nrreq);
    b.free_slots = bi_xzalloc(sizeof(*b.free_slots) * (size_t)b.nrreq);
    for (int i = 0; i < b.nrreq; i++) {
        b.slots[i].iov.iov_base = buf + (size_t)i * (size_t)b.bufsize;
        b.slots[i].iov.iov_len = (size_t)b.bufsize;
        b.slots[i].b = &b;
        b.free_slots[i] = &b.slots[b.nrreq - 1 - i];
    }
    b.n_free = b.nrreq;

    struct timespec t1, t2;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    submit(&b);
    while (b.n > 0 && !b.error) {
        bi_aio_poll(true);
    }
    clock_gettime(CLOCK_MONOTONIC, &t2);
    bi_aio_drain();
    if (b.error) {
        goto out_free;
    }
    printf("Run completed in %3.3f seconds.\n",
           (double)(t2.tv_sec - t1.tv_sec) +
               (double)(t2.tv_nsec - t1.tv_nsec) / 1e9);

    if (stats) {
        print_stats(node);
    }
    ret = 0;
out_free:
    free(b.slots);
    free(b.free_slots);
    bi_free_aligned(buf);
out:;
    bi_error err;
    bi_error_init(&err);
    if (bi_close(node, &err) < 0 && ret == 0) {
        tool_report(&err);
        ret = 1;
    }
    return ret;
}
