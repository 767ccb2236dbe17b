/* SPDX-License-Identifier: MIT */
/*
 * The RBD protocol driver ("rbd", on librbd): private interfaces shared by
 * rbd.c (the driver table: open, I/O, block status, create) and
 * rbd_name.c (file names and options, the cluster connection).
 *
 * Options (the keys of --image-opts), as QEMU 7.2 names them: pool,
 * namespace, image, snapshot, conf (a ceph.conf), user (the client id),
 * key-secret (the id of a secret object whose bytes, in base64, are the
 * cephx key, as QEMU hands it to librados), and
 * "=keyvalue-pairs", the other "name=value" options of an rbd: name
 * (":"-separated, "\" escaping), handed to librados as configuration.
 */
#ifndef BI_PROTOCOL_RBD_H
#define BI_PROTOCOL_RBD_H

#include "block/block.h"
#include "protocol/rbd/rbd_lib.h"
#include "util/util.h"

/* Seconds a connection to the monitors may take unless the configuration
 * says otherwise (librados' default, 300, would look like a hang). */
#define BI_RBD_MOUNT_TIMEOUT "10"

extern const struct bi_opt_desc bi_rbd_runtime_opts[];

/* Parses rbd:pool[/namespace]/image[@snap][:opt=val[:opt=val...]] into
 * options appended to l. Returns 0 or -EINVAL with err set (QEMU's words). */
int bi_rbd_parse_filename(const char *filename, struct bi_optlist *l,
                          bi_error *err);

/* What to open, from the options. */
struct rbd_target {
    char *pool, *ns, *image, *snap, *conf, *user;
    char *pairs; /* "=keyvalue-pairs" as given, or NULL */
    char *key;   /* key-secret's bytes in base64 (wiped on free), or NULL */
};

/* Reads and checks the options of one open (opts: "key=value", NULL-
 * terminated) into t (zeroed first). 0 or -errno with err set. */
int bi_rbd_target_parse(const char *const *opts, struct rbd_target *t,
                        bi_error *err);
void bi_rbd_target_free(struct rbd_target *t);
/* QEMU's name for the node: json:{"pool": ..., "driver": "rbd", ...}
 * (malloc'd). */
char *bi_rbd_target_name(const struct rbd_target *t);

/* Connects to the cluster and opens the pool's I/O context (blocking: run
 * it on a worker thread). 0 or -errno with err set in QEMU's words; on
 * failure nothing is left open. */
int bi_rbd_connect(const struct rbd_target *t, bool no_cache, rados_t *cluster,
                   rados_ioctx_t *io, bi_error *err);

#endif
