/*
** data_tracked.h: lib/data.c compiled into a harness (fuzz_tokens.c, fuzz_megatron.c) with
** its allocations and file descriptors tracked. data.c ends the process on a bad file; here
** lib_fail_file longjmps out of the middle of it (libstub.h), so fz_release() frees the blocks
** and closes the descriptors it left behind: no leak from one input to the next.
*/
#ifndef FUZZ_DATA_TRACKED_H
#define FUZZ_DATA_TRACKED_H

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"   // defines: fz_bug

enum { FZ_TRACK_MAX = 4096 };
static void *fz_blocks[FZ_TRACK_MAX];
static int fz_nblocks;
static int fz_fds[64];
static int fz_nfds;

static inline void fz_track(void *p)
{
    if (!p) return;
    if (fz_nblocks == FZ_TRACK_MAX) fz_bug("data.c holds more than %d blocks", FZ_TRACK_MAX);
    fz_blocks[fz_nblocks++] = p;
}

static inline void fz_untrack(void *p)
{
    for (int k = fz_nblocks - 1; k >= 0; k--)
        if (fz_blocks[k] == p) {
            fz_blocks[k] = fz_blocks[--fz_nblocks];
            return;
        }
    if (p) fz_bug("data.c frees a block it did not allocate");
}

static inline void *fz_malloc(size_t n)
{
    void *p = malloc(n);
    fz_track(p);
    return p;
}

static inline void *fz_calloc(size_t n, size_t m)
{
    void *p = calloc(n, m);
    fz_track(p);
    return p;
}

static inline void *fz_realloc(void *q, size_t n)
{
    void *p = realloc(q, n);
    if (p) {
        if (q) fz_untrack(q);
        fz_track(p);
    }
    return p;
}

static inline void fz_free(void *p)
{
    fz_untrack(p);
    free(p);
}

static inline int fz_open(const char *path, int flags)
{
    int fd = open(path, flags);
    if (fd >= 0) {
        if (fz_nfds == (int)(sizeof fz_fds / sizeof fz_fds[0])) fz_bug("too many open files");
        fz_fds[fz_nfds++] = fd;
    }
    return fd;
}

static inline int fz_close(int fd)
{
    for (int k = 0; k < fz_nfds; k++)
        if (fz_fds[k] == fd) {
            fz_fds[k] = fz_fds[--fz_nfds];
            break;
        }
    return close(fd);
}

/* Free every block and close every descriptor data.c still holds. */
static inline void fz_release(void)
{
    while (fz_nblocks > 0) free(fz_blocks[--fz_nblocks]);
    while (fz_nfds > 0) close(fz_fds[--fz_nfds]);
}

#define malloc(n) fz_malloc(n)
#define calloc(n, m) fz_calloc(n, m)
#define realloc(p, n) fz_realloc(p, n)
#define free(p) fz_free(p)
#define open(path, flags) fz_open(path, flags)
#define close(fd) fz_close(fd)
#include "data.c"
#undef malloc
#undef calloc
#undef realloc
#undef free
#undef open
#undef close

#endif
