/* SPDX-License-Identifier: MIT */
/*
 * Formats blkimg recognises but cannot open yet (foreign.c): each is a
 * driver table with a name and QEMU 7.2's probe, and no open. When a real
 * driver for one of them lands in its own folder, its table moves there.
 */
#ifndef BI_FORMAT_FOREIGN_H
#define BI_FORMAT_FOREIGN_H

#include "block/block.h"

extern const struct bi_driver bi_drv_bochs;
extern const struct bi_driver bi_drv_cloop;
extern const struct bi_driver bi_drv_dmg;
extern const struct bi_driver bi_drv_parallels;
extern const struct bi_driver bi_drv_qcow;
extern const struct bi_driver bi_drv_qed;

#endif
