/* SPDX-License-Identifier: MIT */
/*
 * Plumbing shared by `blkimg commit` and `blkimg rebase`: opening the
 * image as qemu-img does, backing names resolved as QEMU resolves them,
 * and running the library's copy engine so that SIGINT / SIGTERM stop it
 * cleanly (requests in flight finish, images are closed consistent).
 */
#ifndef BI_TOOLS_IMG_CHAIN_H
#define BI_TOOLS_IMG_CHAIN_H

#include "blkimg/blkimg.h"
#include "blkimg/convert.h"

#include <stdbool.h>

/* The tool helpers of img_convert.c that commit and rebase use too. */
void cv_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cv_err_exit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cv_getopt_error(char **argv, int c);
const char *strip_file_prefix(const char *msg, const char *file);
bi_node *cv_open_opts(const char *filename, const char *fmt, bool image_opts,
                      struct bi_open_opts *o);
int cv_parse_rate(const char *arg, uint64_t *rate);

/* Opens filename read-write as qemu-img's img_open() (-f, -t, the backing
 * files with the same cache mode, --image-opts); without its backing
 * files if no_backing. Prints the error and returns NULL on failure. */
bi_node *chain_open(const char *filename, const char *fmt, bool image_opts,
                    enum bi_cache cache, bool no_backing, bool quiet_probe);

/* A backing file name as QEMU resolves it: relative to the directory of
 * the overlay's file name. NULL on allocation failure. */
char *chain_resolve_backing(const char *overlay, const char *backing);

/* bi_convert() with SIGINT and SIGTERM stopping the copy cleanly; on
 * -ECANCELED *signame names the signal ("SIGINT" / "SIGTERM"). */
int chain_run_copy(struct bi_convert_opts *o, bi_error *err,
                   const char **signame);

#endif
