/*
** fail.h: errors that every rank detects alike (a bad flag, a bad input file): rank 0 reports
** "WHERE: error: ...", every rank exits with the same code, so no rank is left waiting in a
** collective. The bottom of the library: it calls only the runtime. Errors one rank alone
** detects go through the runtime's RT_CHECK (rt_fail: the rank's message, then the job aborts).
*/
#ifndef GPT_FAIL_H
#define GPT_FAIL_H

#include <stdarg.h>

#include "rt.h"       // defines: RT_PRINTF, RT_NORETURN

void lib_fail_all(int code, const char *fmt, ...) RT_PRINTF(2, 3) RT_NORETURN;
void lib_fail_file(const char *path, const char *fmt, ...) RT_PRINTF(2, 3) RT_NORETURN;
void lib_fail_name(const char *name);
void lib_report_error(const char *where, const char *fmt, va_list ap);

#endif
