/* SPDX-License-Identifier: MIT */
/*
 * blkimg-nbd: qemu-nbd 7.2's command line for serving an image, run as
 * nbdkit with the blkimg plugin. The options become nbdkit's (socket,
 * port, TLS, pid file) and the plugin's (format, cache, discard...); the
 * image is opened once here first, so that a missing file or a wrong
 * format gets qemu-nbd's message and exit code, then nbdkit replaces this
 * process (or, with --fork, runs in the background once it listens).
 */
#include "blkimg/blkimg.h"

#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef BLKIMG_VERSION
#define BLKIMG_VERSION "0.1.0"
#endif

#define PLUGIN_FILE "nbdkit-blkimg-plugin.so"
#define MAX_ARGS 64
#define MAX_OBJECTS 8

static const char *prog = "blkimg-nbd";

/* One line on stderr: "PROG: message". */
static void vmsg(const char *fmt, va_list ap)
{
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

static void err_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void err_msg(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(fmt, ap);
    va_end(ap);
}

static void die(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(fmt, ap);
    va_end(ap);
    exit(EXIT_FAILURE);
}

/* qemu-nbd's words for a bad command line. */
static void usage_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
static void usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: Try `%s --help' for more information.\n", prog, prog);
    exit(EXIT_FAILURE);
}

static void usage(void)
{
    printf(
        "Usage: %s [OPTIONS] FILE\n"
        "Serve FILE over NBD (qemu-nbd's command line), running nbdkit with\n"
        "the blkimg plugin.\n"
        "\n"
        "  -h, --help                display this help and exit\n"
        "  -V, --version             output version information and exit\n"
        "\n"
        "Connection properties:\n"
        "  -p, --port=PORT           port to listen on (default `10809')\n"
        "  -b, --bind=IFACE          interface to bind to (default `0.0.0.0')\n"
        "  -k, --socket=PATH         path to the unix socket\n"
        "  -e, --shared=NUM          device can be shared by NUM clients "
        "(default '1', 0: any)\n"
        "  -t, --persistent          don't exit on the last connection\n"
        "  -v, --verbose             display extra debugging information\n"
        "  -x, --export-name=NAME    expose export by name (default is "
        "empty string)\n"
        "  -D, --description=TEXT    export a human-readable description\n"
        "\n"
        "Exposing part of the image:\n"
        "  -l, --load-snapshot=SNAPSHOT_PARAM\n"
        "                            load an internal snapshot (read-only)\n"
        "  -A, --allocation-depth    refused: nbdkit plugins cannot offer\n"
        "                            qemu:allocation-depth\n"
        "  -B, --bitmap=NAME         refused: nbdkit plugins cannot offer\n"
        "                            qemu:dirty-bitmap contexts\n"
        "\n"
        "General purpose options:\n"
        "  --object type,id=ID,...   define a tls-creds-psk or tls-creds-x509\n"
        "                            object\n"
        "  --tls-creds=ID            use id of an earlier --object to provide\n"
        "                            TLS\n"
        "  --pid-file=PATH           store the server's process ID in the "
        "given file\n"
        "  --fork                    fork off the server process and exit "
        "the parent\n"
        "                            once the server is running\n"
        "\n"
        "Block device options:\n"
        "  -f, --format=FORMAT       set image format (raw, qcow2, ...)\n"
        "  -r, --read-only           export read-only\n"
        "  -n, --nocache             disable host cache (--cache=none)\n"
        "      --cache=MODE          set cache mode used to access the disk "
        "image, the\n"
        "                            valid options are: 'none', "
        "'writeback' (default),\n"
        "                            'writethrough', 'directsync' and "
        "'unsafe'\n"
        "      --aio=MODE            set AIO mode (native, io_uring or "
        "threads)\n"
        "      --discard=MODE        set discard mode (ignore, unmap)\n"
        "      --detect-zeroes=MODE  set detect-zeroes mode (off, on, unmap)\n"
        "      --image-opts          treat FILE as a full set of image "
        "options\n"
        "\n"
        "Report bugs to the blkimg project.\n",
        prog);
}

struct tls_object {
    char *id;
    bool psk;         /* tls-creds-psk, else tls-creds-x509 */
    char *dir;        /* dir= */
    bool verify_peer; /* x509 verify-peer (QEMU's default: on) */
    bool server;      /* endpoint=server */
};

static struct tls_object objects[MAX_OBJECTS];
static int n_objects;

/* --object tls-creds-psk|tls-creds-x509,id=ID,dir=DIR,endpoint=server.
 * Other object types have nothing to do with serving here. */
static void add_object(const char *def)
{
    char *s = strdup(def);
    if (!s)
        die("out of memory");
    char *save = NULL;
    char *type = strtok_r(s, ",", &save);
    if (!type)
        die("Parameter 'qom-type' is missing");
    if (!strncmp(type, "qom-type=", 9))
        type += 9;
    if (strcmp(type, "tls-creds-psk") && strcmp(type, "tls-creds-x509"))
        die("Object type '%s' is not supported here (only tls-creds-psk "
            "and tls-creds-x509)",
            type);
    if (n_objects == MAX_OBJECTS)
        die("too many objects");
    struct tls_object *o = &objects[n_objects];
    *o = (struct tls_object){.psk = !strcmp(type, "tls-creds-psk"),
                             .verify_peer = true,
                             .server = false};
    bool endpoint_set = false;
    for (char *kv; (kv = strtok_r(NULL, ",", &save));) {
        char *eq = strchr(kv, '=');
        if (!eq)
            die("Invalid parameter '%s'", kv);
        *eq = '\0';
        const char *v = eq + 1;
        if (!strcmp(kv, "id")) {
            o->id = strdup(v);
        } else if (!strcmp(kv, "dir")) {
            o->dir = strdup(v);
        } else if (!strcmp(kv, "endpoint")) {
            if (strcmp(v, "server") && strcmp(v, "client"))
                die("Parameter 'endpoint' does not accept value '%s'", v);
            o->server = !strcmp(v, "server");
            endpoint_set = true;
        } else if (!strcmp(kv, "verify-peer") && !o->psk) {
            o->verify_peer =
                strcmp(v, "off") && strcmp(v, "no") && strcmp(v, "false");
        } else if (!strcmp(kv, "username") && o->psk) {
            /* a client's; servers look every user up in the keys */
        } else {
            die("Property '%s.%s' not found", type, kv);
        }
    }
    if (!o->id)
        die("Parameter 'id' is missing");
    if (!endpoint_set)
        o->server = false; /* QEMU's default endpoint is client */
    if (!o->dir)
        die("Unable to access credentials: no dir given for '%s'", o->id);
    n_objects++;
    free(s);
}

static const struct tls_object *find_object(const char *id)
{
    for (int i = 0; i < n_objects; i++)
        if (!strcmp(objects[i].id, id))
            return &objects[i];
    return NULL;
}

/* The plugin next to this program (a build tree), else where it was
 * installed (nbdkit's plugin directory under our prefix), else the name
 * "blkimg", which nbdkit looks up in its own plugin directory. */
static const char *plugin_path(void)
{
    static char path[PATH_MAX];
    const char *env = getenv("BLKIMG_NBDKIT_PLUGIN");
    if (env && *env)
        return env;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        snprintf(path, sizeof(path), "%s/" PLUGIN_FILE, dirname(exe));
        if (access(path, R_OK) == 0)
            return path;
    }
#ifdef NBDKIT_PLUGIN_PATH
    if (access(NBDKIT_PLUGIN_PATH, R_OK) == 0)
        return NBDKIT_PLUGIN_PATH;
#endif
    return "blkimg";
}

struct argv {
    char *v[MAX_ARGS + 1];
    int n;
};

static void push(struct argv *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void push(struct argv *a, const char *fmt, ...)
{
    if (a->n == MAX_ARGS)
        die("too many arguments");
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&a->v[a->n], fmt, ap) < 0)
        die("out of memory");
    va_end(ap);
    a->v[++a->n] = NULL;
}

/* Opens the image as the server will, to report what qemu-nbd reports. */
static void check_image(const char *file, const char *fmt, enum bi_cache cache,
                        bool read_only, const char *snapshot)
{
    struct bi_open_opts o;
    bi_open_opts_init(&o);
    o.format = fmt;
    o.cache = cache;
    o.backing_cache = cache;
    o.read_write = !read_only;
    o.quiet_probe = true;
    bi_error err;
    bi_error_init(&err);
    bi_node *n = bi_open(file, &o, &err);
    if (!n) {
        /* the library words it as qemu-img's img_open, which adds
         * "Could not open 'FILE': " to what blk_new_open says */
        char prefix[PATH_MAX + 32];
        snprintf(prefix, sizeof(prefix), "Could not open '%s': ", file);
        const char *msg = err.msg;
        if (!strncmp(msg, prefix, strlen(prefix)))
            msg += strlen(prefix);
        die("Failed to blk_new_open '%s': %s", file, msg);
    }
    (void)snapshot; /* the plugin loads it: its message is qemu-nbd's */
    bi_close(n, NULL);
}

/* --fork: nbdkit forks into the background itself once it listens (and
 * the plugin opened the image); its first process exits then, with 0,
 * or with 1 when the server could not start. Returns that status. */
static int run_forked(struct argv *a)
{
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        execvp(a->v[0], a->v);
        err_msg("Failed to run %s: %s", a->v[0], strerror(errno));
        _exit(EXIT_FAILURE);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR)
            die("waitpid: %s", strerror(errno));
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? EXIT_SUCCESS
                                                         : EXIT_FAILURE;
}

enum {
    OPT_OBJECT = 256,
    OPT_TLSCREDS,
    OPT_TLSAUTHZ,
    OPT_PID_FILE,
    OPT_FORK,
    OPT_CACHE,
    OPT_AIO,
    OPT_DISCARD,
    OPT_DETECT_ZEROES,
    OPT_IMAGE_OPTS,
};

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {"bind", required_argument, NULL, 'b'},
        {"port", required_argument, NULL, 'p'},
        {"socket", required_argument, NULL, 'k'},
        {"offset", required_argument, NULL, 'o'},
        {"read-only", no_argument, NULL, 'r'},
        {"allocation-depth", no_argument, NULL, 'A'},
        {"bitmap", required_argument, NULL, 'B'},
        {"connect", required_argument, NULL, 'c'},
        {"disconnect", no_argument, NULL, 'd'},
        {"list", no_argument, NULL, 'L'},
        {"snapshot", no_argument, NULL, 's'},
        {"load-snapshot", required_argument, NULL, 'l'},
        {"nocache", no_argument, NULL, 'n'},
        {"cache", required_argument, NULL, OPT_CACHE},
        {"aio", required_argument, NULL, OPT_AIO},
        {"discard", required_argument, NULL, OPT_DISCARD},
        {"detect-zeroes", required_argument, NULL, OPT_DETECT_ZEROES},
        {"shared", required_argument, NULL, 'e'},
        {"format", required_argument, NULL, 'f'},
        {"persistent", no_argument, NULL, 't'},
        {"verbose", no_argument, NULL, 'v'},
        {"object", required_argument, NULL, OPT_OBJECT},
        {"export-name", required_argument, NULL, 'x'},
        {"description", required_argument, NULL, 'D'},
        {"tls-creds", required_argument, NULL, OPT_TLSCREDS},
        {"tls-authz", required_argument, NULL, OPT_TLSAUTHZ},
        {"image-opts", no_argument, NULL, OPT_IMAGE_OPTS},
        {"trace", required_argument, NULL, 'T'},
        {"fork", no_argument, NULL, OPT_FORK},
        {"pid-file", required_argument, NULL, OPT_PID_FILE},
        {NULL, 0, NULL, 0},
    };
    const char *bindto = NULL, *port = NULL, *sockpath = NULL;
    const char *fmt = NULL, *export_name = "", *desc = NULL;
    const char *tls_creds = NULL, *pid_file = NULL, *snapshot = NULL;
    const char *aio = NULL;
    bool read_only = false, persistent = false, verbose = false;
    bool fork_process = false, image_opts = false, discard_unmap = false;
    enum bi_cache cache = BI_CACHE_WRITEBACK;
    enum bi_detect_zeroes dz = BI_DETECT_ZEROES_OFF;
    long shared = 1;
    int c;

    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hVb:p:k:o:rAB:c:dLsl:ne:f:tvx:D:T:",
                            longopts, NULL)) != -1) {
        switch (c) {
        case 'h':
            usage();
            return EXIT_SUCCESS;
        case 'V':
            printf("%s " BLKIMG_VERSION "\n", prog);
            return EXIT_SUCCESS;
        case 'b':
            bindto = optarg;
            break;
        case 'p': {
            char *end;
            errno = 0;
            long v = strtol(optarg, &end, 0);
            if (errno || *end || v < 0 || v > 65535)
                usage_error("Invalid port number '%s'", optarg);
            port = optarg;
            break;
        }
        case 'k':
            sockpath = optarg;
            if (sockpath[0] != '/')
                die("socket path must be absolute");
            break;
        case 'r':
            read_only = true;
            break;
        case 'A':
            die("--allocation-depth is not supported: nbdkit plugins offer "
                "only base:allocation");
        case 'B':
            die("--bitmap is not supported: nbdkit plugins offer only "
                "base:allocation");
        case 'c':
        case 'd':
            die("kernel NBD devices (--connect, --disconnect) are not "
                "supported; use nbd-client");
        case 'L':
            die("--list is not supported; use nbdinfo --list");
        case 's':
            die("--snapshot is not supported; create an overlay with "
                "blkimg create -b");
        case 'o':
            die("--offset is not supported; use the image option "
                "'offset' of the raw format with --image-opts");
        case 'T':
            die("--trace is not supported");
        case 'l':
            snapshot = optarg;
            if (!strncmp(snapshot, "snapshot.", 9))
                die("--load-snapshot takes an id or a name here");
            read_only = true;
            break;
        case 'n':
            cache = BI_CACHE_NONE;
            break;
        case OPT_CACHE:
            if (bi_cache_parse(optarg, &cache) < 0)
                die("Invalid cache mode `%s'", optarg);
            break;
        case OPT_AIO: {
            enum bi_aio a;
            if (bi_aio_parse(optarg, &a) < 0)
                die("Invalid aio mode '%s'", optarg);
            aio = optarg;
            break;
        }
        case OPT_DISCARD:
            if (!strcmp(optarg, "ignore") || !strcmp(optarg, "off"))
                discard_unmap = false;
            else if (!strcmp(optarg, "unmap") || !strcmp(optarg, "on"))
                discard_unmap = true;
            else
                die("Invalid discard option `%s'", optarg);
            break;
        case OPT_DETECT_ZEROES:
            if (bi_detect_zeroes_parse(optarg, &dz) < 0)
                die("Parameter 'detect-zeroes' does not accept value '%s'",
                    optarg);
            break;
        case 'e': {
            char *end;
            errno = 0;
            shared = strtol(optarg, &end, 0);
            if (errno || *end || shared < 0 || shared > INT_MAX)
                die("Invalid shared device number '%s'", optarg);
            break;
        }
        case 'f':
            fmt = optarg;
            break;
        case 't':
            persistent = true;
            break;
        case 'v':
            verbose = true;
            break;
        case OPT_OBJECT:
            add_object(optarg);
            break;
        case 'x':
            export_name = optarg;
            break;
        case 'D':
            desc = optarg;
            if (strlen(desc) > 4096)
                die("Export description '%s' is too long", desc);
            break;
        case OPT_TLSCREDS:
            tls_creds = optarg;
            break;
        case OPT_TLSAUTHZ:
            die("--tls-authz is not supported");
        case OPT_IMAGE_OPTS:
            image_opts = true;
            break;
        case OPT_FORK:
            fork_process = true;
            break;
        case OPT_PID_FILE:
            pid_file = optarg;
            break;
        case ':':
            usage_error("option '%s' requires an argument", argv[optind - 1]);
        default:
            usage_error("unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (argc - optind != 1) {
        fprintf(stderr,
                "%s: Invalid number of arguments\n"
                "Try `%s --help' for more information.\n",
                prog, prog);
        return EXIT_FAILURE;
    }
    const char *file = argv[optind];
    if (sockpath && (port || bindto))
        die("--socket cannot be combined with --port or --bind");
    if (dz == BI_DETECT_ZEROES_UNMAP && !discard_unmap)
        die("setting detect-zeroes to unmap is not allowed without setting "
            "discard operation to unmap");
    if (image_opts && fmt)
        die("--image-opts and -f are mutually exclusive");

    const struct tls_object *tls = NULL;
    if (tls_creds) {
        tls = find_object(tls_creds);
        if (!tls)
            die("No TLS credentials with id '%s'", tls_creds);
        if (!tls->server)
            die("Expecting TLS credentials with a server endpoint");
    }

    if (!image_opts)
        check_image(file, fmt, cache, read_only, snapshot);

    struct argv a = {.n = 0};
    push(&a, "nbdkit");
    if (!fork_process)
        push(&a, "--foreground");
    if (verbose)
        push(&a, "--verbose");
    if (read_only)
        push(&a, "--readonly");
    if (sockpath) {
        push(&a, "--unix=%s", sockpath);
    } else {
        push(&a, "--port=%s", port ? port : "10809");
        if (bindto)
            push(&a, "--ipaddr=%s", bindto);
    }
    if (pid_file)
        push(&a, "--pidfile=%s", pid_file);
    if (tls) {
        push(&a, "--tls=require");
        if (tls->psk) {
            push(&a, "--tls-psk=%s/keys.psk", tls->dir);
        } else {
            push(&a, "--tls-certificates=%s", tls->dir);
            if (tls->verify_peer)
                push(&a, "--tls-verify-peer");
        }
    }
    if (!persistent)
        push(&a, "--filter=exitlast");
    if (shared > 0)
        push(&a, "--filter=limit");
    push(&a, "%s", plugin_path());
    if (image_opts) {
        /* the image options go to the plugin key by key */
        char *s = strdup(file);
        char *save = NULL;
        for (char *kv = strtok_r(s, ",", &save); kv;
             kv = strtok_r(NULL, ",", &save)) {
            if (!strchr(kv, '='))
                die("Invalid parameter '%s'", kv);
            push(&a, "%s", kv);
        }
        free(s);
    } else {
        push(&a, "file=%s", file);
        if (fmt)
            push(&a, "format=%s", fmt);
    }
    if (read_only)
        push(&a, "readonly=true");
    if (snapshot)
        push(&a, "snapshot=%s", snapshot);
    push(&a, "cache=%s", bi_cache_name(cache));
    if (aio)
        push(&a, "aio=%s", aio);
    push(&a, "discard=%s", discard_unmap ? "unmap" : "ignore");
    if (dz != BI_DETECT_ZEROES_OFF)
        push(&a, "detect-zeroes=%s",
             dz == BI_DETECT_ZEROES_ON ? "on" : "unmap");
    push(&a, "export=%s", export_name);
    if (desc)
        push(&a, "description=%s", desc);
    if (shared > 0)
        push(&a, "limit=%ld", shared);
    /* a client that sees multi-conn opens several connections: not when
     * only one is allowed */
    if (shared == 1)
        push(&a, "multi-conn=false");

    fflush(stdout);
    if (fork_process)
        return run_forked(&a);
    execvp(a.v[0], a.v);
    die("Failed to run nbdkit: %s", strerror(errno));
}
