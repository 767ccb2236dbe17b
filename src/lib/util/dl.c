/* SPDX-License-Identifier: MIT */
/*
 * Libraries loaded on first use (see dl.h).
 */
#include "util/dl.h"

#include <dlfcn.h>
#include <errno.h>

/* dlopen of every soname, in order; 0, or -1 with dl->error set. */
static int open_all(struct bi_dl *dl)
{
    for (int i = 0; i < BI_DL_MAX_LIBS && dl->sonames[i]; i++) {
        dl->handles[i] = dlopen(dl->sonames[i], RTLD_NOW | RTLD_LOCAL);
        if (!dl->handles[i]) {
            const char *why = dlerror();
            snprintf(dl->error, sizeof(dl->error), "%s", why ? why : "?");
            return -1;
        }
    }
    return 0;
}

static void close_all(struct bi_dl *dl)
{
    for (int i = BI_DL_MAX_LIBS - 1; i >= 0; i--) {
        if (dl->handles[i])
            dlclose(dl->handles[i]);
        dl->handles[i] = NULL;
    }
}

void *bi_dl_sym(struct bi_dl *dl, const char *name)
{
    for (int i = BI_DL_MAX_LIBS - 1; i >= 0; i--) {
        void *p = dl->handles[i] ? dlsym(dl->handles[i], name) : NULL;
        if (p)
            return p;
    }
    return NULL;
}

int bi_dl_load(struct bi_dl *dl, bi_error *err)
{
    pthread_mutex_lock(&dl->lock);
    if (!dl->tried) {
        dl->tried = true;
        if (open_all(dl) < 0 || dl->resolve(dl) < 0)
            close_all(dl);
        else
            dl->error[0] = '\0';
    }
    pthread_mutex_unlock(&dl->lock);
    if (dl->error[0])
        return bi_error_setc(err, -ENOTSUP, "Could not load %s: %s", dl->what,
                             dl->error);
    return 0;
}
