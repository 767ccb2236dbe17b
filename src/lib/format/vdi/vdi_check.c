/* SPDX-License-Identifier: MIT */
/*
 * vdi check, QEMU 7.2's: every allocated map entry must name a host block
 * below blocks_in_image that no other entry names, and the entries
 * counted must be the header's blocks_allocated. Each problem is one
 * corruption and one "ERROR:" line on stderr in QEMU's words (the check
 * API's convention); nothing is repaired (QEMU refuses -r).
 */
#include "blkimg/qcow2.h"
#include "format/vdi/vdi.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int vdi_check(bi_node *n, struct bi_check_result *res, int fix, bi_error *err)
{
    (void)err;
    vdi_state *s = n->opaque;
    if (fix)
        return -ENOTSUP;
    memset(res, 0, sizeof(*res));
    uint32_t blocks = s->h.blocks;
    uint8_t *used = calloc((size_t)blocks / 8 + 1, 1);
    if (!used) {
        res->check_errors++;
        return -ENOMEM;
    }
    uint32_t counted = 0;
    for (uint32_t b = 0; b < blocks; b++) {
        uint32_t e = le32toh(s->bmap[b]);
        if (!vdi_is_allocated(e))
            continue;
        if (e >= blocks) {
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR: block index %" PRIu32 " too large, is %" PRIu32
                       "",
                       b, e);
            res->corruptions++;
            continue;
        }
        counted++;
        uint8_t bit = (uint8_t)(1u << (e % 8));
        if (used[e / 8] & bit) {
            /* QEMU prints the index twice (the first user is not kept) */
            bi_message(BI_MESSAGE_CHECK,
                       "ERROR: block index %" PRIu32 " also used by %" PRIu32
                       "",
                       e, e);
            res->corruptions++;
        }
        used[e / 8] |= bit;
    }
    free(used);
    if (counted != s->h.allocated) {
        bi_message(BI_MESSAGE_CHECK,
                   "ERROR: allocated blocks mismatch, is %" PRIu32
                   ", should be %" PRIu32 "",
                   counted, s->h.allocated);
        res->corruptions++;
    }
    return 0;
}
