/* SPDX-License-Identifier: MIT */
/*
 * Encrypted qcow2 images, as QEMU 7.2 opens them:
 * - LUKS (crypt_method 2): a LUKS1 header in clusters of the image that
 *   the "full disk encryption" header extension points to; its key slots
 *   lie at offsets relative to that header. Data sectors are numbered by
 *   their host offset.
 * - the legacy AES (crypt_method 1): AES-128-CBC keyed with the first 16
 *   bytes of the secret (zero-padded), plain64 IVs numbered by the guest
 *   offset.
 * Both take the passphrase from the secret encrypt.key-secret names. The
 * key is unlocked here into a sector encryption (s->crypt) that the map
 * hands to the generic layer with every data extent (bi_extent.crypt);
 * the header parsing and key slots are the luks driver's
 * (format/luks/luks_header.h). Compressed clusters are never encrypted,
 * as in QEMU.
 */
#include "crypto/secret.h"
#include "format/luks/luks.h"
#include "format/qcow2/qcow2.h"
#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QC_AES_KEY_LEN 16

/* The LUKS header the crypto extension points to: parsed into s->luks,
 * described in s->luks_info. */
static int read_luks_header(bi_node *n, qcow2_state *s, bi_error *err)
{
    uint8_t h[LUKS_HDR_SIZE];
    if (!s->has_crypto_hdr)
        return qc_error(err, -EINVAL,
                        "Missing CRYPTO header for crypt method 2");
    if (s->crypto_hdr_offset & (s->cluster_size - 1) ||
        s->crypto_hdr_length < sizeof(h) ||
        s->crypto_hdr_offset > s->file_size ||
        s->file_size - s->crypto_hdr_offset < sizeof(h))
        return qc_error(err, -EINVAL,
                        "Invalid encryption header offset or length");
    int ret = bi_co_pread(n->file, s->crypto_hdr_offset, h, sizeof(h));
    if (ret < 0)
        return qc_error(err, ret, "Could not read encryption header: %s",
                        strerror(-ret));
    s->luks = bi_xmalloc(sizeof(*s->luks));
    bi_error e;
    bi_error_init(&e);
    ret = luks_header_parse(h, s->luks, &e);
    if (ret < 0)
        return qc_error(err, ret, "%s", e.msg); /* QEMU's words as they are */
    s->luks_info = luks_header_value(s->luks);
    bi_value_set_string(s->luks_info, "format", "luks");
    return 0;
}

static int luks_unlock(bi_node *n, qcow2_state *s, const char *pw,
                       bi_error *err)
{
    uint8_t *mk = bi_xmalloc(s->luks->key_bytes);
    int ret =
        luks_find_key(s->luks, pw, n->file, s->crypto_hdr_offset, mk, err);
    if (ret == 0)
        ret = bi_crypt_new(&s->luks->p, mk, s->luks->key_bytes, &s->crypt, err);
    bi_crypto_wipe_free(mk, s->luks->key_bytes);
    return ret;
}

static int aes_unlock(qcow2_state *s, const char *pw, bi_error *err)
{
    uint8_t key[QC_AES_KEY_LEN] = {0};
    struct bi_crypt_params p = {BI_CIPHER_AES_128, BI_MODE_CBC,
                                BI_IVGEN_PLAIN64, BI_HASH_SHA256, 512};
    memcpy(key, pw, BI_MIN(strlen(pw), sizeof(key)));
    int ret = bi_crypt_new(&p, key, sizeof(key), &s->crypt, err);
    explicit_bzero(key, sizeof(key));
    return ret;
}

int qc_crypto_open(bi_node *n, qcow2_state *s, const struct bi_open_opts *o,
                   bi_error *err)
{
    const char *fmt = luks_opt(o->driver_opts, "encrypt.format");
    const char *id = luks_opt(o->driver_opts, "encrypt.key-secret");
    if (fmt && strcmp(fmt, "aes") && strcmp(fmt, "luks"))
        return qc_error(err, -EINVAL,
                        "Parameter 'encrypt.format' does not accept value "
                        "'%s'",
                        fmt);
    if (s->crypt_method == QCOW2_CRYPT_NONE) {
        if (fmt)
            return qc_error(err, -EINVAL,
                            "No encryption in image header, but options "
                            "specified format '%s'",
                            fmt);
        return 0;
    }
    const char *hfmt = s->crypt_method == QCOW2_CRYPT_AES ? "aes" : "luks";
    if (fmt && strcmp(fmt, hfmt))
        return qc_error(err, -EINVAL,
                        "Header reported '%s' encryption format but options "
                        "specify '%s'",
                        hfmt, fmt);
    bool need_key = !o->metadata_only || o->read_write;
    if (need_key && !id)
        return qc_error(err, -EINVAL,
                        "Parameter 'encrypt.key-secret' is required for "
                        "cipher");
    if (s->crypt_method == QCOW2_CRYPT_LUKS) {
        int ret = read_luks_header(n, s, err);
        if (ret < 0)
            return ret;
    }
    s->key_secret = id ? bi_xstrdup(id) : NULL;
    if (!need_key)
        return 0;
    char *pw = NULL;
    int ret = bi_secret_lookup_utf8(id, &pw, err);
    if (ret < 0)
        return ret;
    ret = s->crypt_method == QCOW2_CRYPT_AES ? aes_unlock(s, pw, err)
                                             : luks_unlock(n, s, pw, err);
    bi_secret_free(pw);
    return ret;
}

int qc_crypt_buf(qcow2_state *s, bool encrypt, uint64_t guest, uint64_t host,
                 uint8_t *buf, uint64_t len)
{
    uint64_t pos = qc_crypt_pos(s, guest, host);
    uint32_t ss = bi_crypt_sector_size(s->crypt);
    if (pos % ss || len % ss)
        return -EIO; /* requests are aligned to sectors (refresh_limits) */
    return bi_crypt_sectors(s->crypt, encrypt, pos / ss, buf, len);
}

/* ---- creation ---- */

char **qc_luks_create_opts(const char *const *opts)
{
    size_t n = 0, k = 0;
    for (const char *const *p = opts; p && *p; p++)
        n += !strncmp(*p, "encrypt.", 8) && strncmp(*p, "encrypt.format", 14);
    char **v = bi_xmalloc((n + 1) * sizeof(*v));
    for (const char *const *p = opts; p && *p; p++)
        if (!strncmp(*p, "encrypt.", 8) && strncmp(*p, "encrypt.format", 14))
            v[k++] = bi_xstrdup(*p + 8);
    v[k] = NULL;
    return v;
}

void qc_luks_create_opts_free(char **v)
{
    for (char **p = v; p && *p; p++)
        free(*p);
    free(v);
}

void qc_luks_error_words(bi_error *err)
{
    static const char *const keys[] = {"key-secret", "iter-time"};
    for (size_t i = 0; err && i < BI_ARRAY_SIZE(keys); i++) {
        char *pre = bi_xasprintf("Parameter '%s'", keys[i]);
        if (!strncmp(err->msg, pre, strlen(pre))) {
            char *m = bi_xasprintf("Parameter 'encrypt.%s", err->msg + 11);
            snprintf(err->msg, sizeof(err->msg), "%s", m);
            free(m);
        }
        free(pre);
    }
}

struct hdr_alloc {
    bi_node *n;
    uint64_t len;
    int64_t off;
};

static int alloc_header_co(void *arg)
{
    struct hdr_alloc *a = arg;
    qcow2_state *s = a->n->opaque;
    uint64_t nb = qc_size_to_clusters(s, a->len);
    bi_co_mutex_lock(&s->lock);
    a->off = qc_alloc_clusters(a->n, nb);
    int ret = a->off < 0 ? (int)a->off : 0;
    if (ret == 0)
        ret = bi_co_pwrite_zeroes(a->n->file, (uint64_t)a->off,
                                  nb << s->cluster_bits, 0);
    if (ret == 0)
        ret = qc_flush_metadata(a->n);
    bi_co_mutex_unlock(&s->lock);
    return ret;
}

int qc_luks_create_header(bi_node *n, struct luks_header *h, const char *pw,
                          const uint8_t *mk, uint64_t iter_time, uint64_t *off,
                          uint64_t *len, bi_error *err)
{
    struct hdr_alloc a = {n, (uint64_t)h->payload_offset * LUKS_SECTOR, 0};
    int ret = bi_run_co(alloc_header_co, &a);
    if (ret < 0)
        return qc_error(err, ret,
                        "Could not allocate the encryption header: "
                        "%s",
                        strerror(-ret));
    ret =
        luks_store_key(h, 0, pw, mk, iter_time, n->file, (uint64_t)a.off, err);
    if (ret < 0)
        return ret;
    *off = (uint64_t)a.off;
    *len = a.len;
    return 0;
}

void qc_crypto_close(qcow2_state *s)
{
    bi_crypt_free(s->crypt);
    s->crypt = NULL;
    if (s->luks) {
        explicit_bzero(s->luks, sizeof(*s->luks));
        free(s->luks);
        s->luks = NULL;
    }
    free(s->key_secret);
    s->key_secret = NULL;
}
