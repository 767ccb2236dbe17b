/* SPDX-License-Identifier: MIT */
/*
 * qcow2 compressed clusters: raw deflate (window 2^12, as QEMU writes)
 * and zstd frames. Decompression stops once a whole cluster is produced;
 * the stored data may be followed by the next cluster's bytes.
 */
#include "qcow2.h"
#include <errno.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

static int zlib_decompress(const void *src, size_t slen, void *dst, size_t dlen)
{
    z_stream z;
    memset(&z, 0, sizeof(z));
    if (inflateInit2(&z, -12) != Z_OK)
        return -EIO;
    z.next_in = (Bytef *)src;
    z.avail_in = (uInt)slen;
    z.next_out = dst;
    z.avail_out = (uInt)dlen;
    int r = inflate(&z, Z_FINISH);
    int ret = 0;
    /* Z_BUF_ERROR with a full output is fine: trailing bytes remain */
    if ((r != Z_STREAM_END && r != Z_BUF_ERROR) || z.avail_out != 0)
        ret = -EIO;
    inflateEnd(&z);
    return ret;
}

static int zstd_decompress(const void *src, size_t slen, void *dst, size_t dlen)
{
    ZSTD_DCtx *dctx = ZSTD_createDCtx();
    if (!dctx)
        return -ENOMEM;
    ZSTD_inBuffer in = {src, slen, 0};
    ZSTD_outBuffer out = {dst, dlen, 0};
    int ret = 0;
    while (out.pos < out.size) {
        size_t r = ZSTD_decompressStream(dctx, &out, &in);
        if (ZSTD_isError(r)) {
            ret = -EIO;
            break;
        }
        if (r == 0 && out.pos < out.size) {
            /* frame ended early: QEMU accepts only a full cluster */
            ret = -EIO;
            break;
        }
        if (in.pos == in.size && out.pos < out.size && r != 0) {
            ret = -EIO;
            break;
        }
    }
    ZSTD_freeDCtx(dctx);
    return ret;
}

int qc_decompress(int type, const void *src, size_t slen, void *dst,
                  size_t dlen)
{
    switch (type) {
    case QCOW2_COMPRESSION_ZLIB:
        return zlib_decompress(src, slen, dst, dlen);
    case QCOW2_COMPRESSION_ZSTD:
        return zstd_decompress(src, slen, dst, dlen);
    default:
        return -ENOTSUP;
    }
}

static long zlib_compress(const void *src, size_t slen, void *dst, size_t dlen)
{
    z_stream z;
    memset(&z, 0, sizeof(z));
    if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -12, 9,
                     Z_DEFAULT_STRATEGY) != Z_OK)
        return -EIO;
    z.next_in = (Bytef *)src;
    z.avail_in = (uInt)slen;
    z.next_out = dst;
    z.avail_out = (uInt)dlen;
    int r = deflate(&z, Z_FINISH);
    long ret;
    if (r == Z_STREAM_END)
        ret = (long)(dlen - z.avail_out);
    else if (r == Z_OK || r == Z_BUF_ERROR)
        ret = -ENOSPC;
    else
        ret = -EIO;
    deflateEnd(&z);
    return ret;
}

static long zstd_compress(const void *src, size_t slen, void *dst, size_t dlen)
{
    size_t r = ZSTD_compress(dst, dlen, src, slen, ZSTD_CLEVEL_DEFAULT);
    if (ZSTD_isError(r)) {
        if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall)
            return -ENOSPC;
        return -EIO;
    }
    return (long)r;
}

long qc_compress(int type, const void *src, size_t slen, void *dst, size_t dlen)
{
    switch (type) {
    case QCOW2_COMPRESSION_ZLIB:
        return zlib_compress(src, slen, dst, dlen);
    case QCOW2_COMPRESSION_ZSTD:
        return zstd_compress(src, slen, dst, dlen);
    default:
        return -ENOTSUP;
    }
}
