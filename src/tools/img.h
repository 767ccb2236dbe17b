/* SPDX-License-Identifier: MIT */
/* blkimg subcommands: each lives in its own img_<name>.c and is listed in
 * the dispatch table of blkimg.c. Each returns the process exit code. */
#ifndef BI_TOOLS_IMG_H
#define BI_TOOLS_IMG_H

/* qemu-img's documented default format for new images (create, and the
 * output of convert, dd and measure). */
#define IMG_DEFAULT_FORMAT "raw"

int img_create(int argc, char **argv);
int img_info(int argc, char **argv);
int img_map(int argc, char **argv);
int img_bench(int argc, char **argv);
int img_probe(int argc, char **argv);
int img_check(int argc, char **argv);
int img_snapshot(int argc, char **argv);
int img_bitmap(int argc, char **argv);
/* convert --bitmaps (img_bitmap.c): checks before the copy, copy after;
 * both print qemu-img's errors and return -1 on failure. */
struct bi_node;
int cv_check_bitmaps(struct bi_node *src, _Bool skip_broken);
int cv_copy_bitmaps(struct bi_node *src, struct bi_node *dst,
                    _Bool skip_broken);
int img_convert(int argc, char **argv);
int img_compare(int argc, char **argv);
int img_measure(int argc, char **argv);
int img_resize(int argc, char **argv);
int img_rebase(int argc, char **argv);
int img_commit(int argc, char **argv);
int img_amend(int argc, char **argv);
int img_dd(int argc, char **argv);

#endif
