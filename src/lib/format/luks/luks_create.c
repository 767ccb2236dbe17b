/* SPDX-License-Identifier: MIT */
/*
 * luks creation and measure as qemu-img 7.2 does them: QEMU's defaults
 * (aes-256, xts, plain64, sha256, 2 s of PBKDF2), its layout (the header,
 * eight key-material areas aligned to 4 KiB, the payload), a random
 * master key stored in key slot 0 under the key-secret passphrase.
 */
#include "blkimg/convert.h"
#include "crypto/secret.h"
#include "format/luks/luks.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* QEMU 7.2's luks creation options, in its order. */
const struct bi_opt_desc luks_create_opts[] = {
    {"size", BI_OPT_SIZE, "Virtual disk size", NULL, 0},
    {"key-secret", BI_OPT_STRING,
     "ID of the secret that provides the keyslot passphrase", NULL, 0},
    {"cipher-alg", BI_OPT_STRING, "Name of encryption cipher algorithm", NULL,
     0},
    {"cipher-mode", BI_OPT_STRING, "Name of encryption cipher mode", NULL, 0},
    {"ivgen-alg", BI_OPT_STRING, "Name of IV generator algorithm", NULL, 0},
    {"ivgen-hash-alg", BI_OPT_STRING, "Name of IV generator hash algorithm",
     NULL, 0},
    {"hash-alg", BI_OPT_STRING, "Name of encryption hash algorithm", NULL, 0},
    {"iter-time", BI_OPT_NUMBER, "Time to spend in PBKDF in milliseconds", NULL,
     0},
    {NULL, 0, NULL, NULL, 0},
};

struct luks_params {
    const char *secret;
    int cipher; /* bi_cipher_alg, or -2 for QEMU's des/3des */
    const char *cipher_word;
    struct bi_crypt_params p;
    bool has_ivgen_hash;
    enum bi_hash_alg hash;
    uint64_t iter_time;
};

static int bad_value(bi_error *err, const char *key, const char *v)
{
    return luks_error(err, -EINVAL, "Parameter '%s' does not accept value '%s'",
                      key, v);
}

/* The options' values with QEMU's defaults; the names as QEMU's enums
 * take them (des and 3des are names it knows and LUKS refuses). */
static int parse_params(const char *const *opts, struct luks_params *prm,
                        bi_error *err)
{
    const char *v;
    int x;

    memset(prm, 0, sizeof(*prm));
    prm->cipher = BI_CIPHER_AES_256;
    prm->p.mode = BI_MODE_XTS;
    prm->p.ivgen = BI_IVGEN_PLAIN64;
    prm->p.ivgen_hash = BI_HASH_SHA256;
    prm->p.sector_size = LUKS_SECTOR;
    prm->hash = BI_HASH_SHA256;
    prm->iter_time = LUKS_DEFAULT_ITER_TIME;
    prm->secret = luks_opt(opts, "key-secret");
    if ((v = luks_opt(opts, "cipher-alg"))) {
        x = bi_cipher_alg_lookup(v);
        if (x < 0 && strcmp(v, "des") && strcmp(v, "3des"))
            return bad_value(err, "cipher-alg", v);
        prm->cipher = x < 0 ? -2 : x;
        prm->cipher_word = v;
    }
    if ((v = luks_opt(opts, "cipher-mode"))) {
        if ((x = bi_cipher_mode_lookup(v)) < 0)
            return bad_value(err, "cipher-mode", v);
        prm->p.mode = x;
    }
    if ((v = luks_opt(opts, "ivgen-alg"))) {
        if ((x = bi_ivgen_alg_lookup(v)) < 0)
            return bad_value(err, "ivgen-alg", v);
        prm->p.ivgen = x;
    }
    if ((v = luks_opt(opts, "ivgen-hash-alg"))) {
        if ((x = bi_hash_alg_lookup(v)) < 0)
            return bad_value(err, "ivgen-hash-alg", v);
        prm->p.ivgen_hash = x;
        prm->has_ivgen_hash = true;
    }
    prm->has_ivgen_hash |= prm->p.ivgen == BI_IVGEN_ESSIV;
    if ((v = luks_opt(opts, "hash-alg"))) {
        if ((x = bi_hash_alg_lookup(v)) < 0)
            return bad_value(err, "hash-alg", v);
        prm->hash = x;
    }
    if ((v = luks_opt(opts, "iter-time"))) {
        char *end;
        errno = 0;
        unsigned long long t = strtoull(v, &end, 0);
        if (!*v || *end || errno || v[0] == '-')
            return luks_error(err, -EINVAL,
                              "Parameter 'iter-time' expects a number");
        prm->iter_time = t;
    }
    return 0;
}

/* The LUKS cipher name of an algorithm ("aes" for aes-256). */
static const char *luks_cipher_name(enum bi_cipher_alg a)
{
    const char *name = bi_cipher_alg_name(a);
    static char buf[16];
    snprintf(buf, sizeof(buf), "%.*s", (int)strcspn(name, "-"), name);
    return buf;
}

/* The header of a new image for prm, without key material (master key
 * length, names, slot layout, payload offset); checks what QEMU checks
 * before it writes anything. */
static int layout(const struct luks_params *prm, struct luks_header *h,
                  bi_error *err)
{
    memset(h, 0, sizeof(*h));
    if (prm->cipher < 0)
        return luks_error(err, -EINVAL, "Algorithm '%s' not supported",
                          prm->cipher_word);
    h->p = prm->p;
    h->p.cipher = prm->cipher;
    h->hash = prm->hash;
    h->has_ivgen_hash = prm->has_ivgen_hash;
    if (h->p.ivgen == BI_IVGEN_ESSIV &&
        bi_crypt_essiv_cipher(h->p.cipher, h->p.ivgen_hash, err) < 0)
        return -EINVAL;
    if (!bi_cipher_mode_ok(h->p.cipher, h->p.mode))
        return luks_error(err, -ENOTSUP, "Unsupported cipher mode %s",
                          bi_cipher_mode_name(h->p.mode));
    snprintf(h->cipher_name, sizeof(h->cipher_name), "%s",
             luks_cipher_name(h->p.cipher));
    if (h->has_ivgen_hash)
        snprintf(h->cipher_mode, sizeof(h->cipher_mode), "%s-%s:%s",
                 bi_cipher_mode_name(h->p.mode), bi_ivgen_alg_name(h->p.ivgen),
                 bi_hash_alg_name(h->p.ivgen_hash));
    else
        snprintf(h->cipher_mode, sizeof(h->cipher_mode), "%s-%s",
                 bi_cipher_mode_name(h->p.mode), bi_ivgen_alg_name(h->p.ivgen));
    snprintf(h->hash_spec, sizeof(h->hash_spec), "%s",
             bi_hash_alg_name(h->hash));
    h->key_bytes = (uint32_t)bi_cipher_key_len(h->p.cipher) *
                   (h->p.mode == BI_MODE_XTS ? 2 : 1);
    uint32_t header_sectors = LUKS_KEY_SLOT_OFFSET / LUKS_SECTOR;
    uint32_t split = luks_splitkey_sectors(h->key_bytes, LUKS_STRIPES);
    for (int i = 0; i < LUKS_SLOTS; i++) {
        h->slots[i].active = LUKS_SLOT_INACTIVE;
        h->slots[i].key_offset = header_sectors + (uint32_t)i * split;
        h->slots[i].stripes = LUKS_STRIPES;
    }
    h->payload_offset = header_sectors + LUKS_SLOTS * split;
    return 0;
}

/* A random (version 4) UUID as text. */
static void make_uuid(char *out)
{
    uint8_t u[16];
    bi_random_bytes(u, sizeof(u));
    u[6] = (uint8_t)((u[6] & 0x0f) | 0x40);
    u[8] = (uint8_t)((u[8] & 0x3f) | 0x80);
    sprintf(out,
            "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
            "%02x%02x%02x%02x%02x%02x",
            u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
            u[11], u[12], u[13], u[14], u[15]);
}

/* The master key, its digest and PBKDF2 rounds (an eighth of iter_time's
 * worth, as cryptsetup and QEMU), into h; mk gets h->key_bytes bytes. */
static int make_master_key(struct luks_header *h, uint64_t iter_time,
                           uint8_t *mk, bi_error *err)
{
    bi_crypt *c;
    uint64_t iters;
    int ret;

    make_uuid(h->uuid);
    bi_random_bytes(h->mk_salt, LUKS_SALT_LEN);
    bi_random_bytes(mk, h->key_bytes);
    ret = bi_crypt_new(&h->p, mk, h->key_bytes, &c, err);
    if (ret < 0)
        return ret;
    bi_crypt_free(c);
    ret = bi_pbkdf2_count_iters(h->hash, mk, h->key_bytes, h->mk_salt,
                                LUKS_SALT_LEN, LUKS_DIGEST_LEN, &iters, err);
    if (ret < 0)
        return ret;
    if (iter_time && iters > UINT64_MAX / iter_time)
        return luks_error(err, -ERANGE,
                          "PBKDF iterations %" PRIu64 " too large to scale: %s",
                          iters, strerror(ERANGE));
    iters = iters * iter_time / 1000 / 8;
    if (iters > UINT32_MAX)
        return luks_error(err, -ERANGE,
                          "PBKDF iterations %" PRIu64 " larger than %u: %s",
                          iters, UINT32_MAX, strerror(ERANGE));
    h->mk_iters = (uint32_t)BI_MAX(iters, LUKS_MIN_MASTER_ITERS);
    ret = bi_pbkdf2(h->hash, mk, h->key_bytes, h->mk_salt, LUKS_SALT_LEN,
                    h->mk_iters, h->mk_digest, LUKS_DIGEST_LEN);
    return ret < 0 ? luks_error(err, ret, "Cannot digest the master key") : 0;
}

/* Everything QEMU checks before the file: the options, the secret, the
 * layout. *pw is the passphrase (bi_secret_free). */
static int prepare(const char *const *opts, struct luks_params *prm,
                   struct luks_header *h, char **pw, bi_error *err)
{
    *pw = NULL;
    int ret = parse_params(opts, prm, err);
    if (ret < 0)
        return ret;
    if (!prm->secret)
        return luks_error(err, -EINVAL,
                          "Parameter 'key-secret' is required for cipher");
    ret = bi_secret_lookup_utf8(prm->secret, pw, err);
    if (ret < 0)
        return ret;
    ret = layout(prm, h, err);
    if (ret < 0) {
        bi_secret_free(*pw);
        *pw = NULL;
    }
    return ret;
}

int luks_create(const char *filename, const struct bi_create_opts *o,
                bi_error *err)
{
    struct luks_params prm;
    struct luks_header h;
    char *pw;
    uint8_t *mk = NULL;
    bi_node *f = NULL;

    if (o->backing_file)
        return luks_error(err, -ENOTSUP,
                          "Backing file not supported for file format 'luks'");
    int ret = prepare(o->options, &prm, &h, &pw, err);
    if (ret < 0)
        return ret;
    mk = bi_xmalloc(h.key_bytes);
    ret = make_master_key(&h, prm.iter_time, mk, err);
    if (ret < 0)
        goto out;

    struct bi_create_opts fco = *o;
    fco.size = 0;
    fco.options = NULL;
    fco.prealloc = BI_PREALLOC_OFF;
    ret = bi_create_file(filename, &fco, err);
    if (ret < 0)
        goto out;
    struct bi_open_opts oo;
    bi_open_opts_init(&oo);
    oo.read_write = true;
    f = bi_open_protocol(filename, &oo, err);
    if (!f) {
        ret = -EIO;
        goto out;
    }
    uint64_t payload = (uint64_t)h.payload_offset * LUKS_SECTOR;
    ret = bi_truncate(f, payload + o->size, false, o->prealloc, err);
    if (ret == 0)
        ret = luks_store_key(&h, 0, pw, mk, prm.iter_time, f, 0, err);
    if (ret == 0) {
        ret = bi_flush(f);
        if (ret < 0)
            luks_error(err, ret, "Could not flush: %s", strerror(-ret));
    }
out:
    if (f) {
        int r2 = bi_close(f, ret < 0 ? NULL : err);
        if (ret == 0)
            ret = r2;
    }
    if (mk)
        bi_crypto_wipe_free(mk, h.key_bytes);
    explicit_bzero(&h, sizeof(h));
    bi_secret_free(pw);
    return ret;
}

int luks_measure(const char *const *opts, bi_node *src, struct bi_measure *out,
                 bi_error *err)
{
    struct luks_params prm;
    struct luks_header h;
    char *pw;
    uint64_t size = 0;

    int ret = prepare(opts, &prm, &h, &pw, err);
    if (ret < 0)
        return ret;
    bi_secret_free(pw);
    if (src) {
        int64_t len = bi_getlength(src);
        if (len < 0)
            return luks_error(err, (int)len, "Unable to get image size");
        size = (uint64_t)len;
    } else {
        const char *v = luks_opt(opts, "size");
        if (v && bi_parse_size(v, &size) < 0)
            return luks_error(err, -EINVAL, "Parameter 'size' expects a size");
    }
    out->required = (uint64_t)h.payload_offset * LUKS_SECTOR + size;
    out->fully_allocated = out->required;
    return 0;
}

/* ---- a LUKS header inside another format's file (qcow2) ---- */

int luks_new_header(const char *const *opts, struct luks_header *h, char **pw,
                    uint8_t **mk, uint64_t *iter_time, bi_error *err)
{
    struct luks_params prm;
    *mk = NULL;
    int ret = prepare(opts, &prm, h, pw, err);
    if (ret < 0)
        return ret;
    *mk = bi_xmalloc(h->key_bytes);
    ret = make_master_key(h, prm.iter_time, *mk, err);
    if (ret < 0) {
        bi_crypto_wipe_free(*mk, h->key_bytes);
        *mk = NULL;
        bi_secret_free(*pw);
        *pw = NULL;
        return ret;
    }
    *iter_time = prm.iter_time;
    return 0;
}

int luks_new_header_len(const char *const *opts, uint64_t *len, bi_error *err)
{
    struct luks_params prm;
    struct luks_header h;
    char *pw;
    int ret = prepare(opts, &prm, &h, &pw, err);
    if (ret < 0)
        return ret;
    bi_secret_free(pw);
    *len = (uint64_t)h.payload_offset * LUKS_SECTOR;
    return 0;
}
