/* SPDX-License-Identifier: MIT */
/*
 * LUKS-encrypted qcow2 images (crypt_method 2): the LUKS1 header that the
 * qcow2 "full disk encryption" header extension points to, parsed for
 * `info` only (no key is ever handled here: data I/O stays refused).
 *
 * The result is the "encrypt" object of qemu-img info's format-specific
 * data, as a value: format, cipher-alg, cipher-mode, ivgen-alg
 * (ivgen-hash-alg for essiv), hash-alg, payload-offset, master-key-iters,
 * uuid and the eight key slots.
 */
#include "format/qcow2/qcow2.h"
#include "util/util.h"

#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LUKS_HDR_SIZE 592
#define LUKS_SLOTS 8
#define LUKS_SLOT_ACTIVE 0x00AC71F3u
#define LUKS_SLOT_INACTIVE 0x0000DEADu
#define LUKS_SECTOR 512ULL

/* A fixed-size, NUL-padded header string (not always NUL-terminated). */
static void field(char *dst, const uint8_t *src, size_t n)
{
    memcpy(dst, src, n);
    dst[n] = 0;
}

static bool in_list(const char *s, const char *const *list)
{
    for (; *list; list++)
        if (!strcmp(s, *list))
            return true;
    return false;
}

static const char *const hash_names[] = {"md5",       "sha1",   "sha224",
                                         "sha256",    "sha384", "sha512",
                                         "ripemd160", "sm3",    NULL};

/* The cipher algorithm as QEMU names it ("aes-256"), from the LUKS cipher
 * name and the master key size (xts keys are two keys). */
static int cipher_alg(const char *name, const char *mode, uint32_t key_bytes,
                      char *out, size_t out_len)
{
    static const struct {
        const char *name;
        uint32_t key_bytes[3];
    } ciphers[] = {
        {"aes", {16, 24, 32}},     {"cast5", {16, 0, 0}},
        {"serpent", {16, 24, 32}}, {"twofish", {16, 24, 32}},
        {"sm4", {16, 0, 0}},
    };
    if (!strcmp(mode, "xts")) {
        if (key_bytes % 2)
            return -EINVAL;
        key_bytes /= 2;
    }
    for (size_t i = 0; i < BI_ARRAY_SIZE(ciphers); i++) {
        if (strcmp(name, ciphers[i].name))
            continue;
        for (int k = 0; k < 3; k++) {
            if (ciphers[i].key_bytes[k] &&
                ciphers[i].key_bytes[k] == key_bytes) {
                if (!strcmp(name, "sm4"))
                    snprintf(out, out_len, "sm4");
                else
                    snprintf(out, out_len, "%s-%u", name, key_bytes * 8);
                return 0;
            }
        }
    }
    return -EINVAL;
}

static int luks_err(bi_error *err, const char *msg)
{
    bi_error_set(err, EINVAL, "%s", msg);
    return -EINVAL;
}

int qc_luks_info(const uint8_t *h, size_t len, bi_value **info, bi_error *err)
{
    static const uint8_t magic[6] = {'L', 'U', 'K', 'S', 0xba, 0xbe};
    char cname[33], cmode[33], hspec[33], uuid[41];
    char alg[64], mode[33], ivgen[33], ivhash[33];

    *info = NULL;
    if (len < LUKS_HDR_SIZE)
        return luks_err(err, "LUKS header is truncated");
    if (memcmp(h, magic, sizeof(magic)))
        return luks_err(err, "Volume is not in LUKS format");
    uint16_t version = (uint16_t)(h[6] << 8 | h[7]);
    if (version != 1) {
        bi_error_set(err, ENOTSUP, "Unsupported LUKS version %u", version);
        return -ENOTSUP;
    }
    field(cname, h + 8, 32);
    field(cmode, h + 40, 32);
    field(hspec, h + 72, 32);
    uint32_t payload = qc_get32(h + 104);
    uint32_t key_bytes = qc_get32(h + 108);
    uint32_t mk_iters = qc_get32(h + 164);
    field(uuid, h + 168, 40);

    /* "xts-plain64", "cbc-essiv:sha256": mode, ivgen and its hash */
    const char *dash = strchr(cmode, '-');
    if (!dash)
        return luks_err(err, "Unexpected cipher mode string format");
    snprintf(mode, sizeof(mode), "%.*s", (int)(dash - cmode), cmode);
    snprintf(ivgen, sizeof(ivgen), "%s", dash + 1);
    ivhash[0] = 0;
    char *colon = strchr(ivgen, ':');
    if (colon) {
        *colon = 0;
        snprintf(ivhash, sizeof(ivhash), "%s", colon + 1);
    }
    static const char *const modes[] = {"ecb", "cbc", "xts", "ctr", NULL};
    static const char *const ivgens[] = {"plain", "plain64", "essiv", NULL};
    if (!in_list(mode, modes)) {
        bi_error_set(err, ENOTSUP, "Cipher mode '%s' is not supported", mode);
        return -ENOTSUP;
    }
    if (!in_list(ivgen, ivgens)) {
        bi_error_set(err, ENOTSUP, "IV generator '%s' is not supported", ivgen);
        return -ENOTSUP;
    }
    if (!strcmp(ivgen, "essiv") != (ivhash[0] != 0) ||
        (ivhash[0] && !in_list(ivhash, hash_names)))
        return luks_err(err, "Unexpected IV generator hash in cipher mode");
    if (!in_list(hspec, hash_names)) {
        bi_error_set(err, ENOTSUP, "Hash '%s' is not supported", hspec);
        return -ENOTSUP;
    }
    if (cipher_alg(cname, mode, key_bytes, alg, sizeof(alg)) < 0) {
        bi_error_set(err, ENOTSUP,
                     "Cipher '%s' with key size %u bytes is not supported",
                     cname, key_bytes);
        return -ENOTSUP;
    }
    for (const char *c = uuid; *c; c++)
        if (*c < 0x20 || *c > 0x7e || *c == '"' || *c == '\\')
            return luks_err(err, "LUKS header has an invalid UUID");

    bi_value *slots = bi_value_array();
    for (int i = 0; i < LUKS_SLOTS; i++) {
        const uint8_t *ks = h + 208 + 48 * i;
        uint32_t active = qc_get32(ks), iters = qc_get32(ks + 4);
        uint64_t key_off = qc_get32(ks + 40) * LUKS_SECTOR;
        uint32_t stripes = qc_get32(ks + 44);
        if (active != LUKS_SLOT_ACTIVE && active != LUKS_SLOT_INACTIVE) {
            bi_value_free(slots);
            bi_error_set(err, EINVAL,
                         "Key slot %d state is neither active nor inactive", i);
            return -EINVAL;
        }
        bi_value *slot = bi_value_object();
        bi_value_set_bool(slot, "active", active == LUKS_SLOT_ACTIVE);
        if (active == LUKS_SLOT_ACTIVE)
            bi_value_set_int(slot, "iters", iters);
        bi_value_set_uint(slot, "key-offset", key_off);
        if (active == LUKS_SLOT_ACTIVE)
            bi_value_set_int(slot, "stripes", stripes);
        bi_value_append(slots, slot);
    }

    bi_value *v = bi_value_object();
    bi_value_set_string(v, "format", "luks");
    bi_value_set_string(v, "cipher-alg", alg);
    bi_value_set_string(v, "cipher-mode", mode);
    bi_value_set_string(v, "ivgen-alg", ivgen);
    if (ivhash[0])
        bi_value_set_string(v, "ivgen-hash-alg", ivhash);
    bi_value_set_string(v, "hash-alg", hspec);
    bi_value_set_uint(v, "payload-offset", (uint64_t)payload * LUKS_SECTOR);
    bi_value_set_int(v, "master-key-iters", mk_iters);
    bi_value_set_string(v, "uuid", uuid);
    bi_value_set(v, "slots", slots);
    *info = v;
    return 0;
}
