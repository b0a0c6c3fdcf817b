/*
** diag.h: the generator's one message format (STYLE 2.4), on stderr:
**   path:line: error: msg        (+ the source line and a caret when a column is known)
**   path:line: warning: msg
**   gen: error: msg              (no location; also "gen: usage error:", "gen: internal error:")
** plus xmalloc/xrealloc, which die with "gen: out of memory". No policy here: callers decide
** what is an error and main.c decides the exit code.
*/
#ifndef GEN_DIAG_H
#define GEN_DIAG_H

#include <stddef.h>

#define DIAG_PROGNAME "gen"

void diag_report(const char *kind, const char *file, long line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void diag_error(const char *file, long line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void diag_warning(const char *file, long line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void diag_source(const char *text, size_t len, long col);
void diag_text(const char *s);

void *xmalloc(size_t n);
void *xrealloc(void *p, size_t n);

#endif
