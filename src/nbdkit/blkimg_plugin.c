/* SPDX-License-Identifier: MIT */
/*
 * nbdkit-blkimg-plugin: serves any image libblkimg opens (every format,
 * backing chains, an internal snapshot read-only) over NBD through nbdkit.
 *
 * Thread model: the block layer runs in one thread (blkimg.h). The plugin
 * starts that thread, the loop thread, in after_fork; it opens the image
 * and owns the node. nbdkit's worker threads (PARALLEL) queue their
 * requests under a mutex and kick the loop (bi_aio_kick), which submits
 * them with the bi_aio_* calls and waits for completions or more kicks
 * (bi_aio_wait); a completion wakes its worker through a condition
 * variable. So many requests are in flight at once, as many as nbdkit has
 * workers, while only the loop thread touches the library.
 *
 * Every connection shares the one node: a flush from any connection
 * covers the writes of all of them, which is what multi-conn promises.
 */
#define NBDKIT_API_VERSION 2
#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
#include <nbdkit-plugin.h>

#include "blkimg/blkimg.h"
#include "blkimg/image_ops.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_KEYS 64
#define MAX_EXTENTS 1024
#define NBD_MAX_REQ (32u << 20) /* what NBD clients send at most */
#define CACHE_CHUNK (4u << 20)

/* ------------------------------------------------------------ configuration */

static const char *image;       /* file= */
static char *image_abs;         /* its absolute name (malloc'd) */
static const char *format;      /* format= (driver=) */
static const char *snapshot;    /* snapshot= id or name: read-only export */
static const char *export_name; /* export=: the one name served */
static const char *description; /* description= */
static bool readonly;
static bool discard_unmap = true; /* discard=unmap (default) or ignore */
static bool no_backing;
static bool no_lock;
static bool force_share;
static bool multi_conn = true; /* multi-conn=false: not advertised */
static enum bi_cache cache = BI_CACHE_WRITEBACK;
static bool aio_set;
static enum bi_aio aio = BI_AIO_DEFAULT;
static enum bi_detect_zeroes detect_zeroes = BI_DETECT_ZEROES_OFF;
/* --image-opts style keys: the format's (driver_opts) and file.* ones */
static char *driver_opts[MAX_KEYS + 1];
static int n_driver_opts;
static char *protocol_opts[MAX_KEYS + 1];
static int n_protocol_opts;

static int parse_bool(const char *key, const char *value, bool *out)
{
    int r = nbdkit_parse_bool(value);
    if (r < 0)
        return -1; /* nbdkit_parse_bool said why */
    (void)key;
    *out = r;
    return 0;
}

static int add_key(char **list, int *n, const char *key, const char *value)
{
    if (*n == MAX_KEYS) {
        nbdkit_error("too many image options (at most %d)", MAX_KEYS);
        return -1;
    }
    char *kv;
    if (asprintf(&kv, "%s=%s", key, value) < 0) {
        nbdkit_error("asprintf: %m");
        return -1;
    }
    list[(*n)++] = kv;
    return 0;
}

static int blkimg_config(const char *key, const char *value)
{
    if (!strcmp(key, "file") || !strcmp(key, "file.filename")) {
        /* nbdkit changes to / when it forks into the background: a file
         * name is made absolute now; a protocol's name (nbd://, rbd:,
         * json:) is kept, as QEMU tells them apart by the colon */
        const char *colon = strchr(value, ':');
        bool protocol = colon && memchr(value, '/', colon - value) == NULL;
        free(image_abs);
        image_abs = protocol ? strdup(value) : nbdkit_absolute_path(value);
        if (!image_abs) {
            nbdkit_error("%s: %m", value);
            return -1;
        }
        image = image_abs;
    } else if (!strcmp(key, "format") || !strcmp(key, "driver")) {
        format = value;
    } else if (!strcmp(key, "readonly")) {
        return parse_bool(key, value, &readonly);
    } else if (!strcmp(key, "snapshot")) {
        snapshot = value;
    } else if (!strcmp(key, "export")) {
        export_name = value;
    } else if (!strcmp(key, "description")) {
        description = value;
    } else if (!strcmp(key, "cache")) {
        if (bi_cache_parse(value, &cache) < 0) {
            nbdkit_error("invalid cache mode '%s'", value);
            return -1;
        }
    } else if (!strcmp(key, "aio")) {
        if (bi_aio_parse(value, &aio) < 0) {
            nbdkit_error("invalid aio mode '%s'", value);
            return -1;
        }
        aio_set = true;
    } else if (!strcmp(key, "discard")) {
        if (!strcmp(value, "unmap") || !strcmp(value, "on")) {
            discard_unmap = true;
        } else if (!strcmp(value, "ignore") || !strcmp(value, "off")) {
            discard_unmap = false;
        } else {
            nbdkit_error("invalid discard option '%s'", value);
            return -1;
        }
    } else if (!strcmp(key, "detect-zeroes")) {
        if (bi_detect_zeroes_parse(value, &detect_zeroes) < 0) {
            nbdkit_error("invalid detect-zeroes option '%s'", value);
            return -1;
        }
    } else if (!strcmp(key, "backing")) {
        bool b;
        if (parse_bool(key, value, &b) < 0)
            return -1;
        no_backing = !b;
    } else if (!strcmp(key, "locking")) {
        bool b;
        if (parse_bool(key, value, &b) < 0)
            return -1;
        no_lock = !b;
    } else if (!strcmp(key, "multi-conn")) {
        return parse_bool(key, value, &multi_conn);
    } else if (!strcmp(key, "force-share")) {
        return parse_bool(key, value, &force_share);
    } else if (!strncmp(key, "file.", 5) && key[5]) {
        return add_key(protocol_opts, &n_protocol_opts, key + 5, value);
    } else if (strchr(key, '-') || strchr(key, '.')) {
        /* a format's runtime option (l2-cache-size, encrypt.key-secret):
         * checked against the format in config_complete */
        return add_key(driver_opts, &n_driver_opts, key, value);
    } else {
        nbdkit_error("unknown parameter '%s'", key);
        return -1;
    }
    return 0;
}

static int blkimg_config_complete(void)
{
    if (!image && !n_protocol_opts) {
        nbdkit_error("you must supply the file=IMAGE parameter");
        return -1;
    }
    if (snapshot)
        readonly = true; /* a snapshot is exported read-only */
    if (detect_zeroes == BI_DETECT_ZEROES_UNMAP && !discard_unmap) {
        nbdkit_error("setting detect-zeroes to unmap is not allowed without "
                     "setting discard operation to unmap");
        return -1;
    }
    for (int i = 0; i < n_driver_opts; i++) {
        char *eq = strchr(driver_opts[i], '=');
        *eq = '\0';
        const struct bi_opt_desc *d =
            format ? bi_runtime_opt_find(format, driver_opts[i]) : NULL;
        *eq = '=';
        if (!d || (d->flags & BI_OPT_REFUSED)) {
            *eq = '\0';
            nbdkit_error(format ? "the %s format has no option '%s'"
                                : "%s'%s' needs format=FMT",
                         format ? format : "", driver_opts[i]);
            *eq = '=';
            return -1;
        }
    }
    return 0;
}

#define blkimg_config_help                                                     \
    "[file=]<IMAGE>          (required) The disk image to serve.\n"            \
    "format=<FMT>            Its format (default: probed).\n"                  \
    "readonly=true           Open the image read-only.\n"                      \
    "snapshot=<ID|NAME>      Serve an internal snapshot (read-only).\n"        \
    "cache=<MODE>            none, writeback, writethrough, directsync,\n"     \
    "                        unsafe (default writeback).\n"                    \
    "aio=<ENGINE>            io_uring, threads or native.\n"                   \
    "discard=unmap|ignore    Pass trims to the image (default unmap).\n"       \
    "detect-zeroes=off|on|unmap  Turn written zeroes into zero writes.\n"      \
    "backing=false           Do not open the backing chain.\n"                 \
    "locking=false           Take no image locks.\n"                           \
    "force-share=true        Take no locks that conflict with others.\n"       \
    "multi-conn=false        Do not advertise multi-conn.\n"                   \
    "export=<NAME>           The only export name served.\n"                   \
    "description=<TEXT>      The export's description.\n"                      \
    "file.<KEY>=<VALUE>      Options of the protocol node (driver=nbd, "       \
    "...).\n"                                                                  \
    "<KEY>=<VALUE>           The format's runtime options (l2-cache-size...)."

/* -------------------------------------------------------- opening the image */

static void message_handler(void *opaque, enum bi_message_kind kind,
                            const char *message)
{
    (void)opaque;
    if (kind == BI_MESSAGE_ERROR)
        nbdkit_error("%s", message);
    else
        nbdkit_debug("%s", message);
}

/* Opens the image as configured: the node, or NULL with err set. */
static bi_node *open_image(bi_error *err)
{
    struct bi_open_opts o;
    bi_open_opts_init(&o);
    o.format = format;
    o.cache = cache;
    o.backing_cache = cache;
    o.read_write = !readonly;
    o.no_backing = no_backing;
    o.no_lock = no_lock;
    o.force_share = force_share;
    o.quiet_probe = true;
    o.named_by_options = !image;
    o.driver_opts = n_driver_opts ? (const char *const *)driver_opts : NULL;
    o.protocol_opts =
        n_protocol_opts ? (const char *const *)protocol_opts : NULL;
    bi_node *n = bi_open(image, &o, err);
    if (!n) {
        /* "Could not open 'FILE': " twice (qemu-img's words) is once
         * here, as qemu-nbd says it */
        char prefix[64 + sizeof(err->msg)];
        snprintf(prefix, sizeof(prefix),
                 "Could not open '%s': ", image ? image : "");
        size_t pl = strlen(prefix);
        if (image && !strncmp(err->msg, prefix, pl) &&
            !strncmp(err->msg + pl, prefix, pl))
            memmove(err->msg, err->msg + pl, strlen(err->msg + pl) + 1);
        return NULL;
    }
    if (snapshot) {
        /* an id first, then a name, as qemu-nbd -l */
        bi_error serr;
        bi_error_init(&serr);
        int ret = bi_snapshot_load_tmp(n, snapshot, NULL, &serr);
        if (ret < 0) {
            bi_error_init(&serr);
            ret = bi_snapshot_load_tmp(n, NULL, snapshot, &serr);
        }
        if (ret < 0) {
            bi_error_set(err, 0, "Failed to load snapshot: %s", serr.msg);
            err->code = ret;
            bi_close(n, NULL);
            return NULL;
        }
    }
    if (detect_zeroes != BI_DETECT_ZEROES_OFF)
        bi_node_set_detect_zeroes(n, detect_zeroes);
    return n;
}

/*
 * get_ready runs before nbdkit forks into the background: the image is
 * opened once, in a child process, so that a missing file or a wrong
 * format is reported on the terminal while nbdkit's own process keeps no
 * library state (threads and the io_uring ring do not survive its fork;
 * the loop thread opens the image for good in after_fork).
 */
static int blkimg_get_ready(void)
{
    int fds[2];
    if (pipe(fds) < 0) {
        nbdkit_error("pipe: %m");
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        nbdkit_error("fork: %m");
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        bi_error err;
        bi_error_init(&err);
        if (aio_set && bi_aio_select(aio, &err) < 0) {
            (void)!write(fds[1], err.msg, strlen(err.msg));
            _exit(1);
        }
        bi_node *n = open_image(&err);
        if (!n) {
            (void)!write(fds[1], err.msg, strlen(err.msg));
            _exit(1);
        }
        bi_close(n, NULL);
        _exit(0);
    }
    close(fds[1]);
    char msg[sizeof(((bi_error *)0)->msg)];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof(msg) - 1 &&
           (r = read(fds[0], msg + got, sizeof(msg) - 1 - got)) != 0) {
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            break;
        got += (size_t)r;
    }
    msg[got] = '\0';
    close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (got || !WIFEXITED(status) || WEXITSTATUS(status)) {
        nbdkit_error("%s", got ? msg : "opening the image failed");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ the loop */

enum op { OP_READ, OP_WRITE, OP_ZERO, OP_TRIM, OP_FLUSH, OP_EXTENTS };

struct extent {
    uint64_t off, len;
    uint32_t type;
};

struct req {
    enum op op;
    uint64_t off, len;
    struct iovec iov;
    int flags; /* BI_REQ_* */
    bool fua;  /* flush once the request is done */
    bool req_one;
    int ret;
    bool done;
    struct extent *ext; /* OP_EXTENTS: the runs found */
    int n_ext;
    pthread_cond_t cond;
    struct req *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t started_cond = PTHREAD_COND_INITIALIZER;
static struct req *queue_head, *queue_tail; /* under lock */
static bool kick_pending;                   /* under lock */
static bool stopping;                       /* under lock */
static bool loop_started;                   /* under lock */
static int open_ret;                        /* under lock, once started */
static char open_msg[sizeof(((bi_error *)0)->msg)];
static pthread_t loop_thread;
static bool loop_running;

/* The node and what is known of it once the loop thread opened it;
 * read-only afterwards, so any thread may read them. */
static bi_node *node;
static int64_t size;
static bool node_writable;
static struct bi_limits limits;

/* Loop thread only: requests whose completion asks for more (FUA). */
static struct req *again_head;

static void finish(struct req *r, int ret)
{
    pthread_mutex_lock(&lock);
    r->ret = ret;
    r->done = true;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&lock);
}

/* A bi_aio_* completion, in the loop thread. */
static void req_done(void *opaque, int ret)
{
    struct req *r = opaque;
    if (ret == 0 && r->fua) {
        /* FUA: the data is written; now make it durable. Submitted from
         * the loop, not from inside this completion. */
        r->fua = false;
        r->op = OP_FLUSH;
        r->next = again_head;
        again_head = r;
        return;
    }
    finish(r, ret);
}

/* Block status of [off, off+len) as NBD extents, in the loop thread. */
static int do_extents(struct req *r)
{
    uint64_t off = r->off, end = r->off + r->len;
    r->ext = malloc(MAX_EXTENTS * sizeof(*r->ext));
    if (!r->ext)
        return -ENOMEM;
    while (off < end && r->n_ext < MAX_EXTENTS) {
        struct bi_status st;
        int ret = bi_block_status_above(node, NULL, off, end - off, &st);
        if (ret < 0)
            return ret;
        uint64_t len = st.len < end - off ? st.len : end - off;
        if (len == 0)
            break;
        /* qemu-nbd's mapping: no data is a hole, known zeroes are zero */
        uint32_t type = (st.flags & BI_BS_DATA ? 0 : NBDKIT_EXTENT_HOLE) |
                        (st.flags & BI_BS_ZERO ? NBDKIT_EXTENT_ZERO : 0);
        if (r->n_ext && r->ext[r->n_ext - 1].type == type) {
            r->ext[r->n_ext - 1].len += len;
        } else {
            r->ext[r->n_ext++] = (struct extent){off, len, type};
        }
        off += len;
        if (r->req_one)
            break;
    }
    return 0;
}

static void dispatch(struct req *r)
{
    switch (r->op) {
    case OP_READ:
        bi_aio_preadv(node, r->off, &r->iov, 1, req_done, r);
        break;
    case OP_WRITE:
        bi_aio_pwritev(node, r->off, &r->iov, 1, r->flags, req_done, r);
        break;
    case OP_ZERO:
        bi_aio_pwrite_zeroes(node, r->off, r->len, r->flags, req_done, r);
        break;
    case OP_TRIM:
        bi_aio_pdiscard(node, r->off, r->len, req_done, r);
        break;
    case OP_FLUSH:
        bi_aio_flush(node, req_done, r);
        break;
    case OP_EXTENTS:
        /* no aio form: block status runs the loop itself meanwhile */
        finish(r, do_extents(r));
        break;
    }
}

static void *loop_main(void *arg)
{
    (void)arg;
    bi_error err;
    bi_error_init(&err);
    int ret = aio_set ? bi_aio_select(aio, &err) : 0;
    if (ret == 0) {
        node = open_image(&err);
        ret = node ? 0 : (err.code ? err.code : -EIO);
    }
    if (node) {
        size = bi_getlength(node);
        node_writable = !bi_node_read_only(node);
        limits = *bi_node_limits(node);
        if (size < 0) {
            bi_error_set(&err, (int)-size, "Could not get the image size");
            ret = (int)size;
            bi_close(node, NULL);
            node = NULL;
        }
    }
    pthread_mutex_lock(&lock);
    loop_started = true;
    open_ret = ret;
    snprintf(open_msg, sizeof(open_msg), "%s", err.msg);
    pthread_cond_broadcast(&started_cond);
    pthread_mutex_unlock(&lock);
    if (ret < 0)
        return NULL;

    for (;;) {
        pthread_mutex_lock(&lock);
        struct req *list = queue_head;
        queue_head = queue_tail = NULL;
        kick_pending = false;
        bool stop = stopping;
        pthread_mutex_unlock(&lock);

        while (list) {
            struct req *r = list;
            list = r->next;
            dispatch(r);
        }
        while (again_head) {
            struct req *r = again_head;
            again_head = r->next;
            dispatch(r);
        }
        if (stop && bi_aio_in_flight() == 0)
            break;
        bi_aio_wait();
    }
    bi_error_init(&err);
    if (bi_close(node, &err) < 0)
        nbdkit_error("%s", err.msg);
    node = NULL;
    return NULL;
}

static int blkimg_after_fork(void)
{
    bi_set_message_handler(message_handler, NULL);
    int e = pthread_create(&loop_thread, NULL, loop_main, NULL);
    if (e) {
        nbdkit_error("pthread_create: %s", strerror(e));
        return -1;
    }
    loop_running = true;
    pthread_mutex_lock(&lock);
    while (!loop_started)
        pthread_cond_wait(&started_cond, &lock);
    int ret = open_ret;
    pthread_mutex_unlock(&lock);
    if (ret < 0) {
        pthread_join(loop_thread, NULL);
        loop_running = false;
        nbdkit_error("%s", open_msg);
        return -1;
    }
    return 0;
}

static void blkimg_cleanup(void)
{
    if (!loop_running)
        return;
    pthread_mutex_lock(&lock);
    stopping = true;
    pthread_mutex_unlock(&lock);
    bi_aio_kick();
    pthread_join(loop_thread, NULL);
    loop_running = false;
}

static void blkimg_unload(void)
{
    free(image_abs);
    for (int i = 0; i < n_driver_opts; i++)
        free(driver_opts[i]);
    for (int i = 0; i < n_protocol_opts; i++)
        free(protocol_opts[i]);
}

/* Hands r to the loop thread and waits for it. Returns its result. */
static int run(struct req *r)
{
    pthread_cond_init(&r->cond, NULL);
    r->done = false;
    r->next = NULL;
    pthread_mutex_lock(&lock);
    if (queue_tail)
        queue_tail->next = r;
    else
        queue_head = r;
    queue_tail = r;
    bool kick = !kick_pending;
    kick_pending = true;
    pthread_mutex_unlock(&lock);
    if (kick)
        bi_aio_kick();
    pthread_mutex_lock(&lock);
    while (!r->done)
        pthread_cond_wait(&r->cond, &lock);
    pthread_mutex_unlock(&lock);
    pthread_cond_destroy(&r->cond);
    return r->ret;
}

/* Runs r; on failure tells nbdkit (errno and a message). 0 or -1. */
static int run_checked(struct req *r, const char *what)
{
    int ret = run(r);
    if (ret < 0) {
        nbdkit_error("%s at offset %" PRIu64 " (%" PRIu64 " bytes): %s", what,
                     r->off, r->len, strerror(-ret));
        nbdkit_set_error(-ret);
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------- callbacks */

static int blkimg_thread_model(void)
{
    return NBDKIT_THREAD_MODEL_PARALLEL;
}

static int one_handle;

static void *blkimg_open(int client_readonly)
{
    (void)client_readonly;
    if (export_name && strcmp(nbdkit_export_name(), export_name)) {
        nbdkit_error("export '%s' not present", nbdkit_export_name());
        errno = ENOENT;
        return NULL;
    }
    return &one_handle;
}

static int blkimg_list_exports(int readonly_, int is_tls,
                               struct nbdkit_exports *exports)
{
    (void)readonly_;
    (void)is_tls;
    return nbdkit_add_export(exports, export_name ? export_name : "",
                             description);
}

static const char *blkimg_default_export(int readonly_, int is_tls)
{
    (void)readonly_;
    (void)is_tls;
    return export_name ? export_name : "";
}

static const char *blkimg_export_description(void *h)
{
    (void)h;
    return description;
}

static int64_t blkimg_get_size(void *h)
{
    (void)h;
    return size;
}

static uint32_t pow2_floor(uint64_t v)
{
    uint32_t p = 1;
    while ((uint64_t)p * 2 <= v && p < (1u << 31))
        p *= 2;
    return p;
}

/* The node's limits as NBD block sizes: the request alignment is the
 * minimum (smaller requests cost a read-modify-write), the preferred size
 * is the node's (or 4 KiB), the maximum its max transfer, at most what
 * NBD clients send. */
static int blkimg_block_size(void *h, uint32_t *minimum, uint32_t *preferred,
                             uint32_t *maximum)
{
    (void)h;
    uint32_t min = limits.request_alignment ? limits.request_alignment : 1;
    if (min > 65536 || (min & (min - 1)))
        min = 1; /* not expressible in NBD: the library pads anyway */
    uint32_t pref = limits.opt_transfer > 4096 ? limits.opt_transfer : 4096;
    pref = pow2_floor(pref);
    if (pref < min)
        pref = min;
    if (pref > NBD_MAX_REQ)
        pref = NBD_MAX_REQ;
    uint64_t max = limits.max_transfer && limits.max_transfer < NBD_MAX_REQ
                       ? limits.max_transfer
                       : NBD_MAX_REQ;
    max -= max % min;
    if (max < pref)
        max = pref;
    *minimum = min;
    *preferred = pref;
    *maximum = (uint32_t)max;
    return 0;
}

static int blkimg_can_write(void *h)
{
    (void)h;
    return node_writable;
}

static int blkimg_can_flush(void *h)
{
    (void)h;
    return 1;
}

static int blkimg_is_rotational(void *h)
{
    (void)h;
    return 0;
}

static int blkimg_can_trim(void *h)
{
    (void)h;
    return node_writable && discard_unmap;
}

static int blkimg_can_zero(void *h)
{
    (void)h;
    return node_writable;
}

static int blkimg_can_fast_zero(void *h)
{
    (void)h;
    return node_writable;
}

static int blkimg_can_fua(void *h)
{
    (void)h;
    return NBDKIT_FUA_NATIVE;
}

static int blkimg_can_multi_conn(void *h)
{
    (void)h;
    return multi_conn; /* safe: one node serves every connection */
}

static int blkimg_can_extents(void *h)
{
    (void)h;
    return 1;
}

static int blkimg_can_cache(void *h)
{
    (void)h;
    return NBDKIT_CACHE_NATIVE;
}

static int blkimg_pread(void *h, void *buf, uint32_t count, uint64_t offset,
                        uint32_t flags)
{
    (void)h;
    (void)flags;
    struct req r = {.op = OP_READ, .off = offset, .len = count};
    r.iov = (struct iovec){buf, count};
    return run_checked(&r, "read");
}

static int blkimg_pwrite(void *h, const void *buf, uint32_t count,
                         uint64_t offset, uint32_t flags)
{
    (void)h;
    struct req r = {.op = OP_WRITE, .off = offset, .len = count};
    r.iov = (struct iovec){(void *)buf, count};
    r.fua = flags & NBDKIT_FLAG_FUA;
    return run_checked(&r, "write");
}

static int blkimg_flush(void *h, uint32_t flags)
{
    (void)h;
    (void)flags;
    struct req r = {.op = OP_FLUSH};
    return run_checked(&r, "flush");
}

static int blkimg_trim(void *h, uint32_t count, uint64_t offset, uint32_t flags)
{
    (void)h;
    struct req r = {.op = OP_TRIM, .off = offset, .len = count};
    r.fua = flags & NBDKIT_FLAG_FUA;
    return run_checked(&r, "trim");
}

static int blkimg_zero(void *h, uint32_t count, uint64_t offset, uint32_t flags)
{
    (void)h;
    struct req r = {.op = OP_ZERO, .off = offset, .len = count};
    r.fua = flags & NBDKIT_FLAG_FUA;
    if ((flags & NBDKIT_FLAG_MAY_TRIM) && discard_unmap)
        r.flags |= BI_REQ_MAY_UNMAP;
    if (flags & NBDKIT_FLAG_FAST_ZERO)
        r.flags |= BI_REQ_NO_FALLBACK;
    int ret = run(&r);
    if (ret == -ENOTSUP && (flags & NBDKIT_FLAG_FAST_ZERO)) {
        /* not fast here: the client writes the zeroes itself */
        nbdkit_set_error(ENOTSUP);
        return -1;
    }
    if (ret < 0) {
        nbdkit_error("write zeroes at offset %" PRIu64 " (%u bytes): %s",
                     offset, count, strerror(-ret));
        nbdkit_set_error(-ret);
        return -1;
    }
    return 0;
}

static int blkimg_extents(void *h, uint32_t count, uint64_t offset,
                          uint32_t flags, struct nbdkit_extents *extents)
{
    (void)h;
    struct req r = {.op = OP_EXTENTS, .off = offset, .len = count};
    r.req_one = flags & NBDKIT_FLAG_REQ_ONE;
    int ret = run_checked(&r, "block status");
    for (int i = 0; ret == 0 && i < r.n_ext; i++) {
        if (nbdkit_add_extent(extents, r.ext[i].off, r.ext[i].len,
                              r.ext[i].type) < 0)
            ret = -1;
    }
    free(r.ext);
    return ret;
}

/* NBD_CMD_CACHE: reads the range, so that the storage below caches it. */
static int blkimg_cache(void *h, uint32_t count, uint64_t offset,
                        uint32_t flags)
{
    (void)h;
    (void)flags;
    uint32_t chunk = count < CACHE_CHUNK ? count : CACHE_CHUNK;
    void *buf = malloc(chunk ? chunk : 1);
    if (!buf) {
        nbdkit_error("malloc: %m");
        return -1;
    }
    int ret = 0;
    for (uint64_t done = 0; done < count && ret == 0;) {
        uint32_t n = count - done < chunk ? (uint32_t)(count - done) : chunk;
        struct req r = {.op = OP_READ, .off = offset + done, .len = n};
        r.iov = (struct iovec){buf, n};
        ret = run_checked(&r, "cache");
        done += n;
    }
    free(buf);
    return ret;
}

static struct nbdkit_plugin plugin = {
    .name = "blkimg",
    .longname = "nbdkit blkimg plugin (libblkimg disk images)",
    .version = PACKAGE_VERSION,
    .description = "Serves any disk image libblkimg opens: raw, qcow2, vmdk, "
                   "vdi, vpc, vhdx, with backing chains.",
    .magic_config_key = "file",
    .config = blkimg_config,
    .config_complete = blkimg_config_complete,
    .config_help = blkimg_config_help,
    .get_ready = blkimg_get_ready,
    .after_fork = blkimg_after_fork,
    .cleanup = blkimg_cleanup,
    .unload = blkimg_unload,
    .thread_model = blkimg_thread_model,
    .open = blkimg_open,
    .list_exports = blkimg_list_exports,
    .default_export = blkimg_default_export,
    .export_description = blkimg_export_description,
    .get_size = blkimg_get_size,
    .block_size = blkimg_block_size,
    .can_write = blkimg_can_write,
    .can_flush = blkimg_can_flush,
    .is_rotational = blkimg_is_rotational,
    .can_trim = blkimg_can_trim,
    .can_zero = blkimg_can_zero,
    .can_fast_zero = blkimg_can_fast_zero,
    .can_fua = blkimg_can_fua,
    .can_multi_conn = blkimg_can_multi_conn,
    .can_extents = blkimg_can_extents,
    .can_cache = blkimg_can_cache,
    .pread = blkimg_pread,
    .pwrite = blkimg_pwrite,
    .flush = blkimg_flush,
    .trim = blkimg_trim,
    .zero = blkimg_zero,
    .extents = blkimg_extents,
    .cache = blkimg_cache,
    .errno_is_preserved = 0,
};

NBDKIT_REGISTER_PLUGIN(plugin)
