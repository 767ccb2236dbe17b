/* SPDX-License-Identifier: MIT */
/*
 * The NBD protocol driver ("nbd", on libnbd): private interfaces shared by
 * nbd.c (the driver table: open, I/O, limits), nbd_conn.c (connections
 * driven by the block layer's event loop) and nbd_uri.c (file names).
 *
 * Options (the keys of --image-opts and, later, json:), as QEMU 7.2 names
 * them: server.type (inet | unix), server.host, server.port (default
 * 10809), server.path, export, tls-creds (the id of a tls-creds-* object),
 * x-dirty-bitmap (a meta context read instead of base:allocation). And
 * blkimg's own, which nbds:// URLs set: tls (on: TLS required, with the
 * system's X.509 trust when no credentials are named), tls-certificates
 * (a directory as for tls-creds-x509), tls-psk-file, tls-username,
 * multi-conn (most connections to open where the server allows several;
 * default 4, 1 for one).
 */
#ifndef BI_PROTOCOL_NBD_H
#define BI_PROTOCOL_NBD_H

#include "block/block.h"
#include "io/aio.h"
#include "protocol/nbd/nbd_lib.h"
#include "util/util.h"

#include <stdbool.h>
#include <stdint.h>

#define BI_NBD_DEFAULT_PORT "10809"

/* The option keys an open takes (the driver's runtime_opts). */
extern const struct bi_opt_desc bi_nbd_runtime_opts[];

/* Parses an NBD file name into options (appended to l): the URL forms
 * nbd://host[:port]/export, nbd+tcp://, nbd+unix:///export?socket=PATH,
 * nbds://, nbds+tcp://, nbds+unix:// (TLS; their query may also carry
 * tls-creds, tls-certificates, tls-psk-file, tls-username), and QEMU's
 * legacy nbd:unix:PATH[:exportname=E] and nbd:HOST:PORT[:exportname=E].
 * Returns 0, or -EINVAL with err set to QEMU's wording. */
int bi_nbd_parse_filename(const char *filename, struct bi_optlist *l,
                          bi_error *err);

/* Where and how to connect: the options, checked. */
struct nbd_target {
    bool is_unix;
    char *host, *port, *path; /* path for unix; host and port for inet */
    char *export;             /* "" for the default export */
    char *bitmap;             /* x-dirty-bitmap, or NULL */
    /* TLS: tls set means required. psk_file: PSK; else certificates (NULL:
     * the system's trust). */
    bool tls;
    char *certificates, *psk_file, *username;
    bool verify_peer;
    int multi_conn;
};

/* Reads the options of one open into t (zeroed first): opts are
 * "key=value" strings, one option each (a value may hold commas). 0 or
 * -errno with err set (unknown keys, missing server, credentials). */
int bi_nbd_target_parse(const char *const *opts, struct nbd_target *t,
                        bi_error *err);
void bi_nbd_target_free(struct nbd_target *t);
/* QEMU's name for the export: nbd+unix:///EXPORT?socket=PATH or
 * nbd://HOST:PORT[/EXPORT] (malloc'd). */
char *bi_nbd_target_name(const struct nbd_target *t);

/* ---------------------------------------------------------- connections */

struct nbd_conn {
    struct nbd_handle *h;
    struct bi_fd_watch watch;
    int in_flight; /* our commands on h */
    bool ready;    /* negotiated: takes commands */
    bool dead;     /* failed or closed: takes nothing */
    bool auto_go;  /* an extra connection: libnbd negotiates it alone */
    bi_co *waiter; /* a coroutine waiting for the handshake */
    int err;       /* errno of the first failure */
    char *errmsg;  /* libnbd's message for it */
};

/* A command in flight: the issuing coroutine waits on it. */
struct nbd_cmd {
    bi_co *co;
    bool done;
    int err; /* errno from the server or libnbd, 0 on success */
};

/* Creates a handle configured for t (TLS, export, meta contexts) and
 * starts connecting in the loop. The first connection of a node stops
 * before asking for the export (bi_nbd_conn_finish does); others go on
 * alone and become ready when they are. A failure to start is kept in c
 * (c->dead): only running out of memory returns -ENOMEM with err set. */
int bi_nbd_conn_start(struct nbd_conn *c, const struct nbd_target *t,
                      bool first, bi_error *err);
/* Waits (in a coroutine) until c finished its handshake; then asks for
 * the export. Returns 0 when c is ready, -errno with err set to QEMU's
 * words otherwise. */
int bi_nbd_conn_finish(struct nbd_conn *c, const struct nbd_target *t,
                       bi_error *err);
/* After issuing a command or an event: arms the watch for what libnbd
 * waits for next, and notices a dead connection. */
void bi_nbd_conn_update(struct nbd_conn *c);
/* Closes c: stops its watch (waits for it), then closes the handle. */
void bi_nbd_conn_close(struct nbd_conn *c);
/* Completion callback data for libnbd: wakes cmd->co. */
nbd_completion_callback bi_nbd_cmd_callback(struct nbd_cmd *cmd);
/* Issued a command on c (cookie from nbd_aio_*): waits for it and returns
 * 0 or -errno. A cookie of -1 (not issued) returns libnbd's errno. */
int bi_nbd_cmd_wait(struct nbd_conn *c, struct nbd_cmd *cmd, int64_t cookie);

#endif
