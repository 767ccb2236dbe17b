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

#endif
