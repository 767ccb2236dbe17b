/* SPDX-License-Identifier: MIT */
/*
 * Libraries loaded on first use. A protocol whose library is big (its
 * own dependencies, static constructors, relocations) costs every run of
 * blkimg, blkimg-io and the nbdkit plugin start-up time and memory when
 * it is linked, whether the run uses the protocol or not; QEMU keeps its
 * curl, nbd-client and rbd drivers in modules loaded on demand for the
 * same reason. A driver lists the functions it calls (an X-macro),
 * declares a table of pointers to them (BI_DL_POINTER), defines the table
 * and its loader in one line (BI_DL_DEFINE), calls the loader when it
 * first needs the library, and calls through the table.
 */
#ifndef BI_UTIL_DL_H
#define BI_UTIL_DL_H

#include "util/util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define BI_DL_MAX_LIBS 3

/* One library (or a few, loaded in order: librados before librbd). */
struct bi_dl {
    const char *what;                        /* "libnbd": for the message */
    const char *sonames[BI_DL_MAX_LIBS + 1]; /* NULL-terminated */
    /* Fills the driver's table with bi_dl_sym (BI_DL_RESOLVE); 0, or -1
     * with error naming what is missing. */
    int (*resolve)(struct bi_dl *dl);
    /* set by bi_dl_load */
    pthread_mutex_t lock;
    bool tried;
    void *handles[BI_DL_MAX_LIBS];
    char error[256]; /* empty once loaded */
};

#define BI_DL_INIT(what_, resolve_, ...)                                       \
    {                                                                          \
        .what = (what_), .sonames = {__VA_ARGS__, NULL},                       \
        .resolve = (resolve_), .lock = PTHREAD_MUTEX_INITIALIZER,              \
    }

/* Loads dl's libraries and resolves its table, once per process
 * (thread-safe; the libraries stay loaded until the process ends).
 * 0, or -ENOTSUP with err set ("Could not load WHAT: ...")
 * now and on every later call. */
int bi_dl_load(struct bi_dl *dl, bi_error *err);

/* The address of name in dl's libraries (the last loaded first), or
 * NULL. For resolve. */
void *bi_dl_sym(struct bi_dl *dl, const char *name);

/* A table member for the library function name, of its own type. */
#define BI_DL_POINTER(name) __typeof__(name) *name;

/* In resolve: table.name = the function name, or return -1 naming it.
 * (POSIX: a function's address from dlsym is valid as one.) */
#define BI_DL_RESOLVE(dl, table, name)                                         \
    do {                                                                       \
        void *p_ = bi_dl_sym((dl), #name);                                     \
        if (!p_) {                                                             \
            snprintf((dl)->error, sizeof((dl)->error), "it lacks %s", #name);  \
            return -1;                                                         \
        }                                                                      \
        memcpy(&(table).name, &p_, sizeof(p_));                                \
    } while (0)

/* Defines a driver's library in one line: the table TABLE (of type TYPE,
 * its members BI_DL_POINTER's for each of FUNCTIONS), its resolve
 * function and LOADFN(bi_error *err), which loads WHAT from the sonames
 * (as bi_dl_load). */
#define BI_DL_ENTRY_(name) BI_DL_RESOLVE(dl_, *tbl_, name);
#define BI_DL_DEFINE(TYPE, TABLE, FUNCTIONS, LOADFN, WHAT, ...)                \
    TYPE TABLE;                                                                \
    static int LOADFN##_resolve(struct bi_dl *dl_)                             \
    {                                                                          \
        TYPE *tbl_ = &TABLE;                                                   \
        FUNCTIONS(BI_DL_ENTRY_)                                                \
        return 0;                                                              \
    }                                                                          \
    static struct bi_dl LOADFN##_dl =                                          \
        BI_DL_INIT(WHAT, LOADFN##_resolve, __VA_ARGS__);                       \
    int LOADFN(bi_error *err)                                                  \
    {                                                                          \
        return bi_dl_load(&LOADFN##_dl, err);                                  \
    }

#endif
