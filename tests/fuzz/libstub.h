/*
** libstub.h: the training library's failure exits for a harness. lib_fail_all, lib_fail_file
** (a rejected input) and rt_fail (a broken invariant, or out of memory) normally end the
** process; in a harness they longjmp back to the fz_catch point set by FZ_TRY, with the
** message in fz_msg. libstub.c defines them, and rt_rank/rt_world for a single rank.
*/
#ifndef FUZZ_LIBSTUB_H
#define FUZZ_LIBSTUB_H

#include <setjmp.h>

enum { FZ_OK, FZ_REJECTED, FZ_INTERNAL };   /* how a call ended: returned, lib_fail_*, rt_fail */

extern jmp_buf fz_catch;
extern char fz_msg[512];

/* FZ_TRY: 0 on the way in, FZ_REJECTED or FZ_INTERNAL when the library failed. */
#define FZ_TRY() setjmp(fz_catch)

#endif
