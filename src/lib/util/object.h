/* SPDX-License-Identifier: MIT */
/*
 * Objects the user defines with --object (QEMU's user-creatable objects),
 * by id, for the drivers that refer to them: TLS credentials today
 * (tls-creds-psk, tls-creds-x509, with QEMU 7.2's properties and checks).
 */
#ifndef BI_OBJECT_H
#define BI_OBJECT_H

#include "util/util.h"

struct bi_object {
    char *type; /* "tls-creds-psk", "tls-creds-x509" */
    char *id;
    struct bi_optlist props; /* every property as given, id included */
};

/* The object with that id, or NULL. */
const struct bi_object *bi_object_find(const char *id);
/* Value of property key (the last given), or NULL. */
const char *bi_object_prop(const struct bi_object *obj, const char *key);

/* QEMU's boolean words: 1 for on/yes/true/y, 0 for off/no/false/n,
 * -EINVAL for anything else. */
int bi_parse_bool(const char *v);

#endif
