/* SPDX-License-Identifier: MIT */
/*
 * The "secret" object type (registered with util/object.c when the
 * library loads) and the lookup drivers use.
 */
#include "crypto/secret.h"
#include "crypto/crypto.h"
#include "util/object.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* --------------------------------------------------------------- base64 */

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *bi_base64_encode(const uint8_t *in, size_t len)
{
    char *out = bi_xmalloc((len + 2) / 3 * 4 + 1), *o = out;

    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < len)
            v |= in[i + 2];
        *o++ = b64_alphabet[v >> 18];
        *o++ = b64_alphabet[(v >> 12) & 63];
        *o++ = i + 1 < len ? b64_alphabet[(v >> 6) & 63] : '=';
        *o++ = i + 2 < len ? b64_alphabet[v & 63] : '=';
    }
    *o = 0;
    return out;
}

static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

int bi_base64_decode(const char *in, size_t inlen, uint8_t **out,
                     size_t *outlen, bi_error *err)
{
    if (memchr(in, '\0', inlen))
        return bi_error_setc(err, -EINVAL,
                             "Base64 data contains embedded NUL characters");
    for (size_t i = 0; i < inlen; i++)
        if (in[i] != '=' && b64_value(in[i]) < 0)
            return bi_error_setc(err, -EINVAL,
                                 "Base64 data contains invalid characters");
    uint8_t *o = bi_xmalloc(inlen / 4 * 3 + 4);
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < inlen; i++) {
        if (in[i] == '=')
            continue;
        acc = (acc << 6) | (uint32_t)b64_value(in[i]);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[n++] = (uint8_t)(acc >> bits);
        }
    }
    acc = 0;
    o[n] = 0;
    *out = o;
    *outlen = n;
    return 0;
}

/* ---------------------------------------------------------- the object */

static bool secret_prop_known(const char *key)
{
    static const char *const keys[] = {"data",  "file", "format",
                                       "keyid", "iv",   "loaded"};
    for (size_t i = 0; i < BI_ARRAY_SIZE(keys); i++)
        if (!strcmp(keys[i], key))
            return true;
    return false;
}

/* The whole of path, *len bytes (a NUL after them). */
static int read_file(const char *path, uint8_t **out, size_t *len,
                     bi_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    /* the words of glib's g_file_get_contents, which QEMU reports */
    if (fd < 0)
        return bi_error_setc(err, -errno,
                             "Unable to read %s: Failed to open file \u201c%s"
                             "\u201d: %s",
                             path, path, strerror(errno));
    if (fstat(fd, &st) < 0 || S_ISDIR(st.st_mode)) {
        int e = S_ISDIR(st.st_mode) ? EISDIR : errno;
        close(fd);
        return bi_error_setc(err, -e,
                             "Unable to read %s: Error reading file \u201c%s"
                             "\u201d: %s",
                             path, path, strerror(e));
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = bi_xmalloc(cap + 1);
    for (;;) {
        if (n == cap) {
            uint8_t *nb = bi_xmalloc(cap * 2 + 1);
            memcpy(nb, buf, n);
            bi_crypto_wipe_free(buf, cap + 1);
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            bi_crypto_wipe_free(buf, cap + 1);
            return bi_error_setc(err, -e,
                                 "Unable to read %s: Error reading file "
                                 "\u201c%s\u201d: %s",
                                 path, path, strerror(e));
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

/* The object's bytes by id, without a copy. */
static const struct bi_object *find_secret(const char *id, bi_error *err)
{
    const struct bi_object *o = bi_object_find(id);
    if (!o) {
        bi_error_setc(err, -ENOENT, "No secret with id '%s'", id);
        return NULL;
    }
    if (strcmp(o->type, "secret")) {
        bi_error_setc(err, -EINVAL, "Object with id '%s' is not a secret", id);
        return NULL;
    }
    return o;
}

/* QEMU's decryption of a secret with the keyid secret: AES-256-CBC, the
 * IV given in base64, padding as the last byte's count. in (inlen
 * bytes) is replaced by the plaintext. */
static int decrypt(const struct bi_optlist *props, uint8_t **in, size_t *inlen,
                   bool base64, bi_error *err)
{
    const char *keyid = bi_optlist_get(props, "keyid");
    const char *ivs = bi_optlist_get(props, "iv");
    const struct bi_object *ko = find_secret(keyid, err);
    uint8_t *iv = NULL, *ct = NULL;
    size_t ivlen = 0, ctlen = 0;
    bi_cipher *c = NULL;
    int ret = -EINVAL;

    if (!ko)
        return -ENOENT;
    if (ko->data_len != 32)
        return bi_error_setc(err, -EINVAL, "Key should be 32 bytes in length");
    if (!ivs)
        return bi_error_setc(err, -EINVAL, "IV is required to decrypt secret");
    ret = bi_base64_decode(ivs, strlen(ivs), &iv, &ivlen, err);
    if (ret < 0)
        return ret;
    if (ivlen != 16) {
        free(iv);
        return bi_error_setc(err, -EINVAL,
                             "IV should be 16 bytes in length not %zu", ivlen);
    }
    if (base64) {
        ret = bi_base64_decode((const char *)*in, *inlen, &ct, &ctlen, err);
        if (ret < 0)
            goto out;
    } else {
        ct = bi_xmalloc(*inlen + 1);
        memcpy(ct, *in, *inlen);
        ctlen = *inlen;
    }
    ret = bi_cipher_new(BI_CIPHER_AES_256, BI_MODE_CBC, ko->data, 32, &c, err);
    if (ret == 0)
        ret = bi_cipher_setiv(c, iv, 16);
    if (ret == 0)
        ret = bi_cipher_decrypt(c, ct, ctlen, err);
    if (ret == 0) {
        uint8_t pad = ctlen ? ct[ctlen - 1] : 0;
        if (pad > 16 || pad > ctlen) {
            ret = bi_error_setc(err, -EINVAL,
                                "Incorrect number of padding bytes (%d) found "
                                "on decrypted data",
                                pad);
        } else {
            ctlen -= pad;
            ct[ctlen] = 0;
            bi_crypto_wipe_free(*in, *inlen);
            *in = ct;
            *inlen = ctlen;
            ct = NULL;
        }
    }
out:
    bi_cipher_free(c);
    free(iv);
    if (ct)
        bi_crypto_wipe_free(ct, ctlen + 1);
    return ret;
}

static int secret_complete(struct bi_object *obj, bi_error *err)
{
    const struct bi_optlist *props = &obj->props;
    const char *data = bi_optlist_get(props, "data");
    const char *file = bi_optlist_get(props, "file");
    const char *fmt = bi_optlist_get(props, "format");
    uint8_t *buf = NULL;
    size_t len = 0;
    int ret;

    bool base64 = false;
    if (fmt && !strcmp(fmt, "base64")) {
        base64 = true;
    } else if (fmt && strcmp(fmt, "raw")) {
        return bi_error_setc(
            err, -EINVAL, "Parameter 'format' does not accept value '%s'", fmt);
    }
    if (file) {
        if (data)
            return bi_error_setc(err, -EINVAL,
                                 "'file' and 'data' are mutually exclusive");
        ret = read_file(file, &buf, &len, err);
        if (ret < 0)
            return ret;
    } else if (data) {
        len = strlen(data);
        buf = bi_xmalloc(len + 1);
        memcpy(buf, data, len + 1);
    } else {
        return bi_error_setc(err, -EINVAL,
                             "Either 'file' or 'data' must be provided");
    }
    if (bi_optlist_get(props, "keyid")) {
        ret = decrypt(props, &buf, &len, base64, err);
    } else if (base64) {
        uint8_t *dec;
        size_t dlen;
        ret = bi_base64_decode((const char *)buf, len, &dec, &dlen, err);
        if (ret == 0) {
            bi_crypto_wipe_free(buf, len + 1);
            buf = dec;
            len = dlen;
        }
    } else {
        ret = 0;
    }
    if (ret < 0) {
        bi_crypto_wipe_free(buf, len + 1);
        return ret;
    }
    /* the property's copy of the data goes: obj->data is the secret */
    for (int i = 0; i < props->n; i++)
        if (!strcmp(props->v[i].key, "data") && props->v[i].value)
            explicit_bzero(props->v[i].value, strlen(props->v[i].value));
    obj->data = buf;
    obj->data_len = len;
    return 0;
}

static const struct bi_object_type secret_type = {
    .name = "secret",
    .prop_known = secret_prop_known,
    .complete = secret_complete,
};

__attribute__((constructor)) static void secret_register(void)
{
    bi_object_type_register(&secret_type);
}

/* ---------------------------------------------------------------- lookup */

/* A copy of len bytes (and a NUL) that bi_secret_free can wipe: a length
 * prefix tells it exactly how much it gave. */
static uint8_t *secret_copy(const void *data, size_t len)
{
    uint8_t *p = bi_xmalloc(sizeof(size_t) + len + 1);
    memcpy(p, &len, sizeof(size_t));
    memcpy(p + sizeof(size_t), data, len);
    p[sizeof(size_t) + len] = 0;
    return p + sizeof(size_t);
}

int bi_secret_lookup(const char *id, uint8_t **out, size_t *len, bi_error *err)
{
    const struct bi_object *o = find_secret(id, err);
    if (!o)
        return bi_object_find(id) ? -EINVAL : -ENOENT;
    *out = secret_copy(o->data, o->data_len);
    *len = o->data_len;
    return 0;
}

static bool valid_utf8(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        if (c == 0)
            return false; /* a NUL inside: not a passphrase */
        if (c < 0x80) {
            i++;
            continue;
        }
        int k = (c & 0xe0) == 0xc0   ? 1
                : (c & 0xf0) == 0xe0 ? 2
                : (c & 0xf8) == 0xf0 ? 3
                                     : -1;
        if (k < 0 || c < 0xc2 || c > 0xf4 || (size_t)k >= n - i)
            return false;
        for (int j = 1; j <= k; j++)
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
        i += (size_t)k + 1;
    }
    return true;
}

int bi_secret_lookup_utf8(const char *id, char **out, bi_error *err)
{
    uint8_t *p;
    size_t len;
    int ret = bi_secret_lookup(id, &p, &len, err);
    if (ret < 0)
        return ret;
    if (!valid_utf8(p, len)) {
        bi_secret_free(p);
        return bi_error_setc(err, -EINVAL,
                             "Data from secret %s is not valid UTF-8", id);
    }
    *out = (char *)p;
    return 0;
}

int bi_secret_lookup_base64(const char *id, char **out, bi_error *err)
{
    uint8_t *data;
    size_t len;
    int ret = bi_secret_lookup(id, &data, &len, err);

    if (ret == 0) {
        char *text = bi_base64_encode(data, len);
        size_t n = strlen(text);
        *out = (char *)secret_copy(text, n);
        explicit_bzero(text, n);
        free(text);
        bi_secret_free(data);
    }
    return ret;
}

void bi_secret_free(void *p)
{
    if (!p)
        return;
    uint8_t *base = (uint8_t *)p - sizeof(size_t);
    size_t len;
    memcpy(&len, base, sizeof(size_t));
    bi_crypto_wipe_free(base, sizeof(size_t) + len + 1);
}
