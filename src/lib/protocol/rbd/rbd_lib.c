/* SPDX-License-Identifier: MIT */
/*
 * Loading librbd and librados on first use (see rbd_lib.h).
 */
#include "protocol/rbd/rbd_lib.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* The sonames of Ceph's C libraries (packages librbd1, librados2): their
 * ABI versions have not changed since they were first released. */
#define LIBRADOS_SONAME "librados.so.2"
#define LIBRBD_SONAME "librbd.so.1"

struct bi_rbd_lib bi_rbd;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[256] = "not loaded"; /* empty once loaded */

/* The address of name in one of the two libraries, or NULL. */
static void *find(void *rados, void *rbd, const char *name)
{
    void *p = dlsym(rbd, name);
    return p ? p : dlsym(rados, name);
}

static void load(void)
{
    void *rados = dlopen(LIBRADOS_SONAME, RTLD_NOW | RTLD_LOCAL);
    void *rbd = rados ? dlopen(LIBRBD_SONAME, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!rbd) {
        const char *why = dlerror();
        snprintf(load_error, sizeof(load_error), "%s", why ? why : "?");
        if (rados)
            dlclose(rados);
        return;
    }
    struct bi_rbd_lib l;
    void *p;
    /* (POSIX: a function's address from dlsym is valid as one) */
#define BI_RBD_RESOLVE(name)                                                   \
    p = find(rados, rbd, #name);                                               \
    memcpy(&l.name, &p, sizeof(p));                                            \
    if (!p) {                                                                  \
        snprintf(load_error, sizeof(load_error), "%s lacks %s", LIBRBD_SONAME, \
                 #name);                                                       \
        return;                                                                \
    }
    BI_RBD_FUNCTIONS(BI_RBD_RESOLVE)
#undef BI_RBD_RESOLVE
    bi_rbd = l; /* the libraries stay loaded until the process ends */
    load_error[0] = '\0';
}

int bi_rbd_load(bi_error *err)
{
    pthread_once(&load_once, load);
    if (load_error[0]) {
        bi_error_set(err, ENOTSUP, "Could not load the rbd libraries: %s",
                     load_error);
        return -ENOTSUP;
    }
    return 0;
}
