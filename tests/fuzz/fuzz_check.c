/* SPDX-License-Identifier: MIT */
/*
 * fuzz_check: the input is an image file, opened read-write (a copy).
 * bi_check runs without repair, then with BI_CHECK_FIX_LEAKS |
 * BI_CHECK_FIX_ERRORS; when the repair ran and left no corruption, a
 * check of the same node and one after closing and reopening the image
 * must find none either.
 */
#include "blkimg/qcow2.h"
#include "fuzz_common.h"

#include <string.h>

/* bi_check with fix; 0 with *r filled when the check ran. */
static int check(bi_node *n, int fix, struct bi_check_result *r)
{
    bi_error err;

    memset(r, 0, sizeof(*r));
    bi_error_init(&err);
    return bi_check(n, fix, r, &err);
}

/* A check after a clean repair: no corruption may be left. */
static void recheck(bi_node *n, const char *when)
{
    struct bi_check_result r;

    if (check(n, 0, &r) < 0)
        return;
    FUZZ_ASSERT(r.corruptions == 0,
                "%s: %d corruptions after a repair that left none", when,
                r.corruptions);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_put_image("fuzz-check.img", data, size);
    struct bi_check_result r;
    bi_node *n = fuzz_open(path, true);

    if (!n)
        return 0;
    if (check(n, 0, &r) < 0) {
        bi_close(n, NULL);
        return 0;
    }
    int ret = check(n, BI_CHECK_FIX_ALL, &r);
    bool clean = ret == 0 && r.corruptions == 0 && r.check_errors == 0;
    if (clean)
        recheck(n, "same node");
    if (bi_close(n, NULL) < 0 || !clean)
        return 0;
    n = fuzz_open(path, true);
    FUZZ_ASSERT(n, "a repaired image does not open again");
    recheck(n, "reopened");
    bi_close(n, NULL);
    return 0;
}
