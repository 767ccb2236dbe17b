/* SPDX-License-Identifier: MIT */
/*
 * vhdx check, QEMU 7.2's: a log replayed at open is reported (and, with
 * -r, counted as fixed); every fully present payload block must end
 * within the file ("BAT entry ... points after end of file"), one
 * corruption each, in QEMU's words. The headers, region table, metadata and the
 * BAT's overlap with metadata are checked at open (an image failing them does
 * not open, as in QEMU).
 */
#include "blkimg/qcow2.h"
#include "format/vhdx/vhdx.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

int vhdx_check(bi_node *n, struct bi_check_result *res, int fix, bi_error *err)
{
    (void)err;
    vhdx_state *s = n->opaque;
    memset(res, 0, sizeof(*res));
    if (s->log_replayed)
        res->corruptions_fixed++; /* QEMU's count, whatever the mode */
    int64_t flen = bi_getlength(n->file);
    uint64_t blocks = (s->vsize + s->block_size - 1) / s->block_size;
    for (uint64_t b = 0; b < blocks; b++) {
        uint64_t i = vhdx_bat_index(s, b);
        uint64_t e = vhdx_bat_get(s, i);
        if ((e & VHDX_BAT_STATE_MASK) != VHDX_BAT_FULLY_PRESENT)
            continue;
        uint64_t off = e & VHDX_BAT_OFFSET_MASK;
        if (off >= (uint64_t)flen || off + s->block_size > (uint64_t)flen) {
            bool start = off >= (uint64_t)flen;
            /* QEMU's error_report line, without its program prefix */
            bi_message(BI_MESSAGE_CHECK,
                       "VHDX BAT entry %" PRIu64 " %s offset %" PRIu64
                       " points after end of file (%" PRIi64
                       "). Image has probably been truncated.",
                       i, start ? "start" : "end",
                       start ? off : off + s->block_size - 1, flen);
            res->corruptions++;
        }
    }
    return 0;
}
