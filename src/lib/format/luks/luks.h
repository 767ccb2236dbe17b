/* SPDX-License-Identifier: MIT */
/* The luks format driver's state and its pieces (luks.c, luks_create.c,
 * luks_amend.c). */
#ifndef BI_LUKS_H
#define BI_LUKS_H

#include "block/block.h"
#include "format/luks/luks_header.h"

struct luks_state {
    struct luks_header h;
    bi_crypt *crypt;  /* NULL when opened for metadata only */
    char *secret_id;  /* key-secret as opened (amend's old password) */
    uint64_t payload; /* bytes */
};

/* The last "key=value" of opts for key (NULL-terminated), or NULL. */
const char *luks_opt(const char *const *opts, const char *key);
int luks_error(bi_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

int luks_create(const char *filename, const struct bi_create_opts *o,
                bi_error *err);
int luks_measure(const char *const *opts, bi_node *src, struct bi_measure *out,
                 bi_error *err);
extern const struct bi_opt_desc luks_create_opts[];
int luks_amend(bi_node *n, const char *const *options, bool force,
               bi_amend_status_cb *cb, void *opaque, bi_error *err);
extern const struct bi_opt_desc luks_amend_opts[];
/* luks_amend's key slot changes on the header h at base in file (qcow2's
 * encrypt.* amend options, unprefixed); secret_id unlocks the master key
 * for a new slot. */
int luks_amend_keyslots(struct luks_header *h, bi_node *file, uint64_t base,
                        const char *secret_id, const char *const *options,
                        bool force, bi_error *err);

/* A LUKS header inside another format's file (qcow2's encrypt.*): opts
 * are the luks creation keys (key-secret, cipher-alg, ..., iter-time)
 * checked as luks_create checks them. luks_new_header lays out h with a
 * new master key *mk (h->key_bytes, bi_crypto_wipe_free) and the
 * passphrase *pw (bi_secret_free), no key slot active yet (luks_store_key
 * with *iter_time); luks_new_header_len gives the bytes the header and
 * its key material take (QEMU's payload offset). 0 or -errno with err
 * set. */
int luks_new_header(const char *const *opts, struct luks_header *h, char **pw,
                    uint8_t **mk, uint64_t *iter_time, bi_error *err);
int luks_new_header_len(const char *const *opts, uint64_t *len, bi_error *err);

#endif
