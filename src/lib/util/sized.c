/* SPDX-License-Identifier: MIT */
/* Public structs that grow (blkimg.h): copying between the size a program
 * was built with and the size the library knows. */
#include "util/util.h"

#include <errno.h>
#include <string.h>

int bi_struct_in(void *full, size_t full_size, const void *given,
                 size_t given_size)
{
    const unsigned char *g = given;

    if (given_size < sizeof(size_t))
        return -EINVAL;
    /* A newer program's fields this library does not know must be unset:
     * a request it cannot honour is refused, not ignored. */
    for (size_t i = full_size; i < given_size; i++) {
        if (g[i])
            return -EINVAL;
    }
    memcpy(full, given, given_size < full_size ? given_size : full_size);
    *(size_t *)full = full_size;
    return 0;
}

void bi_struct_out(void *given, size_t given_size, const void *full,
                   size_t full_size)
{
    if (given_size > full_size) {
        memset((unsigned char *)given + full_size, 0, given_size - full_size);
        given_size = full_size;
    }
    memcpy(given, full, given_size);
}
