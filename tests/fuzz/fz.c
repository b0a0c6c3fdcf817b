/*
** fz.c: the harnesses' shared helpers (fuzz.h): the private temporary directory under $TMPDIR
** (or /tmp), input files written into it, and fz_bug. Linked into every harness, with
** libFuzzer and with replay.c alike.
*/
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"   // defines: fz_dir, fz_file, fz_bug

enum { FZ_SLOTS = 4 };
static char dir[256];
static char paths[FZ_SLOTS][320];

/* Remove the files the harness wrote (every name ever given to fz_file) and the directory. */
static void fz_cleanup(void)
{
    for (int k = 0; k < FZ_SLOTS; k++)
        if (paths[k][0]) unlink(paths[k]);
    if (dir[0]) rmdir(dir);
}

const char *fz_dir(void)
{
    if (!dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(fz_cleanup);
    }
    return dir;
}

const char *fz_file(int slot, const char *name, const void *data, size_t size)
{
    if (slot < 0 || slot >= FZ_SLOTS) fz_bug("fz_file: slot %d", slot);
    char *p = paths[slot];
    if (p[0]) unlink(p);
    snprintf(p, sizeof paths[slot], "%s/%s", fz_dir(), name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror(p);
        abort();
    }
    const char *s = data;
    while (size > 0) {
        ssize_t w = write(fd, s, size);
        if (w <= 0) {
            perror(p);
            abort();
        }
        s += w;
        size -= (size_t)w;
    }
    close(fd);
    return p;
}

int fz_argv(const uint8_t *data, size_t size, const char *prog, char **argv, char **text)
{
    int argc = 0;
    *text = malloc(size + 1);
    if (!*text) fz_bug("out of memory");
    memcpy(*text, data, size);
    (*text)[size] = 0;
    argv[argc++] = (char *)prog;
    for (size_t at = 0; at < size && argc < FZ_MAX_ARGS; at += strlen(*text + at) + 1)
        argv[argc++] = *text + at;
    argv[argc] = NULL;
    return argc;
}

void fz_bug(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz: bug: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}
