/* SPDX-License-Identifier: MIT */
/* Alignment arithmetic, iovec helpers, zero detection, aligned memory. */
#include "tap.h"
#include "util/util.h"

#include <errno.h>
#include <stdio.h>

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = (unsigned char)(seed + i * 7);
    }
}

int main(void)
{
    /* ---- alignment arithmetic ---- */
    ok(bi_is_pow2(1) && bi_is_pow2(512) && bi_is_pow2(1ULL << 63),
       "powers of two");
    ok(!bi_is_pow2(0) && !bi_is_pow2(3) && !bi_is_pow2(4097),
       "non-powers of two");
    is_uint(bi_align_down(4097, 4096), 4096, "align_down");
    is_uint(bi_align_down(4095, 4096), 0, "align_down below one block");
    is_uint(bi_align_up(4097, 4096), 8192, "align_up");
    is_uint(bi_align_up(8192, 4096), 8192, "align_up of aligned value");
    is_uint(bi_align_up(0, 512), 0, "align_up of 0");
    is_uint(bi_align_up(1000, 3), 1002, "align_up, non-power-of-two");
    is_uint(bi_align_down(1000, 3), 999, "align_down, non-power-of-two");
    is_uint(bi_align_down(UINT64_MAX, 512), UINT64_MAX - 511,
            "align_down near 2^64");
    ok(bi_is_aligned(1536, 512) && !bi_is_aligned(1537, 512), "is_aligned");
    ok(bi_ptr_aligned((void *)0x1000, 4096) &&
           !bi_ptr_aligned((void *)0x1200, 4096),
       "ptr_aligned");
    is_int(BI_MIN(3, 4), 3, "BI_MIN");
    is_int(BI_MAX(3, 4), 4, "BI_MAX");

    /* ---- memory ---- */
    size_t ps = bi_page_size();
    ok(ps >= 4096 && bi_is_pow2(ps), "page size %zu", ps);
    is_uint(bi_page_size(), ps, "page size cached");
    unsigned char *big = bi_alloc_aligned(ps, 3 * ps);
    ok(big && bi_ptr_aligned(big, ps), "alloc_aligned to the page size");
    void *tiny = bi_alloc_aligned(1, 10);
    ok(tiny && bi_ptr_aligned(tiny, sizeof(void *)),
       "alloc_aligned raises alignment to a pointer");
    bi_free_aligned(tiny);
    ok(bi_alloc_aligned(3000, 10) == NULL, "non-power-of-two alignment fails");
    /* buffers of a huge page or more start on one (sysfs gives the size) */
    unsigned long long sys_huge = 0;
    FILE *hf = fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r");
    if (hf) {
        if (fscanf(hf, "%llu", &sys_huge) != 1) {
            sys_huge = 0;
        }
        fclose(hf);
    }
    size_t huge = bi_huge_page_size();
    is_uint(huge, sys_huge > ps ? sys_huge : 0,
            "huge page size from sysfs (%zu)", huge);
    if (huge) {
        unsigned char *hb = bi_alloc_aligned(ps, 2 * huge + ps);
        ok(hb && bi_ptr_aligned(hb, huge),
           "a buffer of two huge pages starts on one");
        memset(hb, 0x5a, 2 * huge + ps);
        ok(hb[0] == 0x5a && hb[2 * huge + ps - 1] == 0x5a,
           "the whole huge-page buffer is usable");
        bi_free_aligned(hb);
        void *sm = bi_alloc_aligned(ps, huge / 2);
        ok(sm && bi_ptr_aligned(sm, ps),
           "a smaller buffer keeps its alignment");
        bi_free_aligned(sm);
    } else {
        ok(1, "no transparent huge pages here: nothing to align to");
        ok(1, "no transparent huge pages here");
        ok(1, "no transparent huge pages here");
    }
    char *s = bi_xasprintf("%s-%d", "x", 42);
    is_str(s, "x-42", "xasprintf");
    free(s);
    s = bi_xstrdup("dup");
    is_str(s, "dup", "xstrdup");
    free(s);

    /* ---- iovec helpers ---- */
    unsigned char a[100], b[1], c[50], flat[151], out[151];
    fill(a, sizeof(a), 1);
    fill(b, sizeof(b), 2);
    fill(c, sizeof(c), 3);
    struct iovec iov[4] = {
        {a, sizeof(a)}, {NULL, 0}, {b, sizeof(b)}, {c, sizeof(c)}};
    is_uint(bi_iov_size(iov, 4), 151, "iov_size");
    memcpy(flat, a, 100);
    flat[100] = b[0];
    memcpy(flat + 101, c, 50);

    memset(out, 0, sizeof(out));
    bi_iov_to_buf(iov, 4, 0, out, 151);
    ok(memcmp(out, flat, 151) == 0, "to_buf, whole vector");
    memset(out, 0, sizeof(out));
    bi_iov_to_buf(iov, 4, 99, out, 10);
    ok(memcmp(out, flat + 99, 10) == 0, "to_buf across entries");
    bi_iov_to_buf(iov, 4, 151, out, 0);
    ok(1, "to_buf of nothing at the end");

    unsigned char src[151];
    fill(src, sizeof(src), 9);
    bi_iov_from_buf(iov, 4, 95, src, 20);
    ok(memcmp(a + 95, src, 5) == 0 && b[0] == src[5] &&
           memcmp(c, src + 6, 14) == 0,
       "from_buf across entries");
    ok(a[94] == flat[94] && c[14] == flat[115], "from_buf stays in range");

    bi_iov_memset(iov, 4, 100, 0, 51);
    ok(b[0] == 0 && bi_buf_is_zero(c, 50) && a[99] == src[4],
       "memset of a tail range");

    struct iovec sl[4];
    int n = bi_iov_slice(iov, 4, 50, 60, sl, 4);
    is_int(n, 3, "slice across three entries (empty one skipped)");
    ok(sl[0].iov_base == a + 50 && sl[0].iov_len == 50, "slice part 1");
    ok(sl[1].iov_base == b && sl[1].iov_len == 1, "slice part 2");
    ok(sl[2].iov_base == c && sl[2].iov_len == 9, "slice part 3");
    is_uint(bi_iov_size(sl, n), 60, "slice size");
    is_int(bi_iov_slice(iov, 4, 50, 60, sl, 2), -EINVAL,
           "slice needing more entries than allowed");
    is_int(bi_iov_slice(iov, 4, 100, 52, sl, 4), -EINVAL, "slice past the end");
    is_int(bi_iov_slice(iov, 4, 151, 0, sl, 4), 0, "empty slice at the end");
    n = bi_iov_slice(iov, 4, 100, 1, sl, 1);
    ok(n == 1 && sl[0].iov_base == b, "slice starting at an entry boundary");

    /* Alignment of vectors: bases and lengths separately. */
    struct iovec al[2] = {{big, 4096}, {big + 8192, 512}};
    ok(bi_iov_aligned(al, 2, 512, 512), "aligned vector");
    ok(!bi_iov_aligned(al, 2, 512, 4096), "length not a multiple");
    al[1].iov_base = big + 8192 + 256;
    ok(!bi_iov_aligned(al, 2, 512, 512), "base not aligned");
    ok(bi_iov_aligned(al, 2, 256, 512), "base aligned to a smaller unit");
    ok(bi_iov_aligned(al, 0, 4096, 4096), "empty vector is aligned");

    /* ---- randomised: slice/copy against a flat reference ---- */
    {
        unsigned char pool[4096], ref[4096], tmp[4096];
        unsigned seed = 12345;
        int failures = 0;

        for (int round = 0; round < 2000; round++) {
            struct iovec v[8], part[8];
            int cnt = 1 + (int)((seed = seed * 1103515245 + 12345) >> 16) % 8;
            size_t used = 0;

            for (int i = 0; i < cnt; i++) {
                size_t len = ((seed = seed * 1103515245 + 12345) >> 16) % 300;
                v[i].iov_base = pool + used;
                v[i].iov_len = len;
                used += len;
            }
            fill(pool, used, (unsigned)round);
            memcpy(ref, pool, used);
            uint64_t off =
                used ? ((seed = seed * 1103515245 + 12345) >> 16) % (used + 1)
                     : 0;
            uint64_t len =
                ((seed = seed * 1103515245 + 12345) >> 16) % (used - off + 1);
            int np = bi_iov_slice(v, cnt, off, len, part, 8);
            if (np < 0 || bi_iov_size(part, np) != len) {
                failures++;
                continue;
            }
            for (int i = 0; i < np; i++) {
                if (part[i].iov_len == 0) {
                    failures++;
                }
            }
            bi_iov_to_buf(part, np, 0, tmp, len);
            if (memcmp(tmp, ref + off, len) != 0) {
                failures++;
            }
            bi_iov_to_buf(v, cnt, off, tmp, len);
            if (memcmp(tmp, ref + off, len) != 0) {
                failures++;
            }
            /* Write through the slice; only [off, off+len) changes. */
            memset(tmp, 0x5A, len);
            bi_iov_from_buf(part, np, 0, tmp, len);
            memset(ref + off, 0x5A, len);
            if (memcmp(pool, ref, used) != 0) {
                failures++;
            }
        }
        is_int(failures, 0, "2000 random slices and copies match a flat copy");
    }

    /* ---- zero detection ---- */
    memset(big, 0, 3 * ps);
    ok(bi_buf_is_zero(big, 3 * ps), "zero buffer");
    ok(bi_buf_is_zero(big, 0), "empty buffer is zero");
    bool all = true;
    /* A single non-zero byte anywhere, at any start misalignment and
     * length, must be seen. */
    for (size_t start = 0; start < 9; start++) {
        for (size_t pos = 0; pos < 200; pos++) {
            size_t len = 200;
            big[start + pos] = 0x80;
            if (bi_buf_is_zero(big + start, len)) {
                all = false;
            }
            if (pos > 0 && !bi_buf_is_zero(big + start, pos)) {
                all = false; /* the prefix before it is zero */
            }
            big[start + pos] = 0;
        }
    }
    ok(all, "non-zero byte found at every position and offset");
    big[3 * ps - 1] = 1;
    ok(!bi_buf_is_zero(big, 3 * ps), "non-zero last byte");
    ok(bi_buf_is_zero(big, 3 * ps - 1), "all but the last byte zero");
    bi_free_aligned(big);
    return tap_done();
}
