/*
** fail.c: the errors of fail.h, reported once (by rank 0) and ended alike on every rank.
** Called by the flag parser, the data readers, the checkpoint loader and main; tests/fuzz
** replaces this file with tests/fuzz/libstub.c, whose failures longjmp back to the harness.
*/
#include <stdio.h>
#include <stdlib.h>

#include "fail.h"

/*
** "WHERE: error: message" on stderr of rank 0 (WHERE: the file at fault, or "train"); other
** ranks print nothing. Returns: the caller decides whether this ends the run.
*/
void lib_report_error(const char *where, const char *fmt, va_list ap)
{
    if (rt_rank() != 0) return;
    fprintf(stderr, "%s: error: ", where);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

static const char *prog_name = "train";   /* WHERE of lib_fail_all's errors */

/* The program lib_fail_all names ("train" unless set: "generate"). */
void lib_fail_name(const char *name)
{
    prog_name = name;
}

/*
** A usage error (code 2) or a problem without a file (code 1): "train: error: ..." on rank 0,
** then every rank finalizes the runtime and exits with 'code'. Every rank must call it alike.
*/
void lib_fail_all(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    lib_report_error(prog_name, fmt, ap);
    va_end(ap);
    rt_finalize();
    exit(code);
}

/*
** A bad input file: "PATH: error: what is wrong (what was expected)" on rank 0; every rank
** finalizes the runtime and exits 1. Every rank must call it alike.
*/
void lib_fail_file(const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    lib_report_error(path, fmt, ap);
    va_end(ap);
    rt_finalize();
    exit(1);
}
