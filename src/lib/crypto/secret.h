/* SPDX-License-Identifier: MIT */
/*
 * Secrets (QEMU 7.2's "secret" objects: --object secret,id=ID,data=...|
 * file=PATH[,format=raw|base64][,keyid=ID2,iv=B64]) and their lookup by
 * the drivers. The bytes are decoded (and decrypted with the keyid
 * secret, AES-256-CBC) when the object is defined, as QEMU does; a copy
 * handed out is wiped by bi_secret_free. No message ever shows them.
 */
#ifndef BI_SECRET_H
#define BI_SECRET_H

#include "blkimg/blkimg.h"
#include <stddef.h>
#include <stdint.h>

/* A copy of the bytes of secret id in *out (malloc'd, NUL after the len
 * bytes), *len bytes. 0 or -errno with err set: "No secret with id 'x'",
 * "Object with id 'x' is not a secret". */
int bi_secret_lookup(const char *id, uint8_t **out, size_t *len, bi_error *err);
/* The same as a passphrase: valid UTF-8 (QEMU's words when not). */
int bi_secret_lookup_utf8(const char *id, char **out, bi_error *err);
/* The same in base64 (librados takes its key so), malloc'd: free it with
 * bi_secret_free. */
int bi_secret_lookup_base64(const char *id, char **out, bi_error *err);
/* Wipes and frees what a lookup returned (NULL: nothing). */
void bi_secret_free(void *p);

/* Standard base64 with padding, NUL-terminated, malloc'd. */
char *bi_base64_encode(const uint8_t *in, size_t len);
/* Base64 as QEMU's qbase64_decode takes it: *out malloc'd. 0 or -EINVAL
 * with err set. */
int bi_base64_decode(const char *in, size_t inlen, uint8_t **out,
                     size_t *outlen, bi_error *err);

#endif
