/*
** libstub.c: stand-ins for what lib/data.c, lib/flags.c and lib/safetensors.c call outside
** themselves (libstub.h): the failure exits of lib/fail.c and runtime/rt_common.c, which here
** record the message and longjmp back to the harness, and a world of one rank.
*/
#include <stdarg.h>
#include <stdio.h>

#include "fail.h"       // defines: lib_fail_all, lib_fail_file (and rt.h: rt_fail, rt_rank)
#include "libstub.h"    // defines: fz_catch, fz_msg

jmp_buf fz_catch;
char fz_msg[512];

void lib_fail_all(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(fz_msg, sizeof fz_msg, "train: error %d: ", code);
    vsnprintf(fz_msg + n, sizeof fz_msg - (size_t)n, fmt, ap);
    va_end(ap);
    longjmp(fz_catch, FZ_REJECTED);
}

void lib_fail_file(const char *path, const char *fmt, ...)
{
    (void)path;   /* a temporary file's name: left out, so that messages are reproducible */
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(fz_msg, sizeof fz_msg, "FILE: error: ");
    vsnprintf(fz_msg + n, sizeof fz_msg - (size_t)n, fmt, ap);
    va_end(ap);
    longjmp(fz_catch, FZ_REJECTED);
}

void rt_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(fz_msg, sizeof fz_msg, "%s:%d: ", file, line);
    vsnprintf(fz_msg + n, sizeof fz_msg - (size_t)n, fmt, ap);
    va_end(ap);
    longjmp(fz_catch, FZ_INTERNAL);
}

int rt_rank(void)
{
    return 0;
}

int rt_world(void)
{
    return 1;
}
