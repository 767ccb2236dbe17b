/* SPDX-License-Identifier: MIT */
/*
 * Objects the user defines with --object (QEMU's user-creatable objects),
 * by id, for the drivers that refer to them: TLS credentials
 * (tls-creds-psk, tls-creds-x509, with QEMU 7.2's properties and checks)
 * and the types a layer above registers (bi_object_type_register: the
 * crypto layer's secrets), so that util depends on nothing.
 */
#ifndef BI_OBJECT_H
#define BI_OBJECT_H

#include "util/util.h"

struct bi_object {
    char *type; /* "tls-creds-psk", "tls-creds-x509", "secret" */
    char *id;
    struct bi_optlist props; /* every property as given, id included */
    /* What a registered type's complete() made of the properties (a
     * secret's bytes); wiped with explicit_bzero when freed. */
    uint8_t *data;
    size_t data_len;
};

/* An object type defined above util. */
struct bi_object_type {
    const char *name;
    /* Whether the type takes property key (besides id and qom-type). */
    bool (*prop_known)(const char *key);
    /* Checks the properties as QEMU does when it creates the object and
     * fills obj->data; 0 or -errno with err set in QEMU's words. May look
     * up objects defined before (a secret's keyid). */
    int (*complete)(struct bi_object *obj, bi_error *err);
};
/* Registers t (static storage) once, at library load. */
void bi_object_type_register(const struct bi_object_type *t);

/* The object with that id, or NULL. */
const struct bi_object *bi_object_find(const char *id);
/* Value of property key (the last given), or NULL. */
const char *bi_object_prop(const struct bi_object *obj, const char *key);

/* QEMU's boolean words: 1 for on/yes/true/y, 0 for off/no/false/n,
 * -EINVAL for anything else. */
int bi_parse_bool(const char *v);

#endif
