/*
** diag.c: prints located messages for the generator (see diag.h for the formats). Everything
** goes to stderr, after flushing stdout so that the two streams interleave in order.
** xmalloc/xrealloc live here because running out of memory is reported like any other
** message; they are the one place outside main.c that ends the process (STYLE 2.4).
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "diag.h"   // defines: diag_report, diag_error, diag_warning, diag_source, xmalloc

static void diag_vreport(const char *kind, const char *file, long line, const char *fmt,
                         va_list ap)
{
    fflush(stdout);
    if (file == NULL)
        fprintf(stderr, "%s: %s: ", DIAG_PROGNAME, kind);
    else if (line > 0)
        fprintf(stderr, "%s:%ld: %s: ", file, line, kind);
    else
        fprintf(stderr, "%s: %s: ", file, kind);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

/*
** Print "file:line: kind: msg" ("file: kind: msg" when line <= 0, "gen: kind: msg" when
** file is NULL). 'kind' is "error", "warning", "usage error", "internal error", ...
*/
void diag_report(const char *kind, const char *file, long line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(kind, file, line, fmt, ap);
    va_end(ap);
}

/*
** Print an error located at file:line (see diag_report for NULL file / line <= 0).
*/
void diag_error(const char *file, long line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport("error", file, line, fmt, ap);
    va_end(ap);
}

/*
** Print a warning located at file:line.
*/
void diag_warning(const char *file, long line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport("warning", file, line, fmt, ap);
    va_end(ap);
}

/*
** Print the source line 'text' ('len' bytes, no newline) and under it a caret at byte
** column 'col' (1-based) followed by "near here" (re2c, ninja). Tabs in the line are
** repeated under it and UTF-8 continuation bytes take no column, so the caret lines up.
** A 'col' outside the line prints only the line.
*/
void diag_source(const char *text, size_t len, long col)
{
    fflush(stdout);
    fprintf(stderr, "%.*s\n", (int)len, text);
    if (col < 1 || (size_t)(col - 1) > len) return;
    for (size_t i = 0; i + 1 < (size_t)col; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '\t') fputc('\t', stderr);
        else if ((c & 0xC0) != 0x80) fputc(' ', stderr);
    }
    fputs("^ near here\n", stderr);
}

/*
** Print 's' as it is (a traceback, a hint line) followed by a newline.
*/
void diag_text(const char *s)
{
    fflush(stdout);
    fprintf(stderr, "%s\n", s);
}

static _Noreturn void diag_oom(void)
{
    fflush(stdout);
    fprintf(stderr, "%s: out of memory\n", DIAG_PROGNAME);
    exit(3);
}

/*
** malloc that never returns NULL: prints "gen: out of memory" and exits with status 3.
*/
void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) diag_oom();
    return p;
}

/*
** realloc that never returns NULL (same failure as xmalloc).
*/
void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL) diag_oom();
    return q;
}
