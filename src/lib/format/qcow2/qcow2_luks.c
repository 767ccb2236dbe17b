/* SPDX-License-Identifier: MIT */
/*
 * LUKS-encrypted qcow2 images (crypt_method 2): the LUKS1 header that the
 * qcow2 "full disk encryption" header extension points to, parsed for
 * `info` only (no key is ever handled here: data I/O stays refused).
 *
 * The parsing and the description are the luks driver's
 * (format/luks/luks_header.h); qemu-img info's "encrypt" object is that
 * description with "format": "luks".
 */
#include "format/luks/luks_header.h"
#include "format/qcow2/qcow2.h"
#include "util/util.h"

#include <errno.h>

int qc_luks_info(const uint8_t *h, size_t len, bi_value **info, bi_error *err)
{
    struct luks_header hdr;

    *info = NULL;
    if (len < LUKS_HDR_SIZE)
        return bi_error_setc(err, -EINVAL, "LUKS header is truncated");
    int ret = luks_header_parse(h, &hdr, err);
    if (ret < 0)
        return ret;
    bi_value *v = luks_header_value(&hdr);
    bi_value_set_string(v, "format", "luks");
    *info = v;
    return 0;
}
