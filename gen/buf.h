/*
** buf.h: growable byte buffer for the generator (sds-sized): append bytes, strings, printf
** output; read a whole file. Not a string library: no splitting, no searching.
** Used by tmpl.c (Lua source, rendered output), host.c (module loading) and diag.c.
** Memory comes from xmalloc/xrealloc (diag.h), which die on exhaustion.
*/
#ifndef GEN_BUF_H
#define GEN_BUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct buf {
    char *p;        /* bytes [0, len), always NUL-terminated at p[len] once anything was added */
    size_t len;     /* bytes in use, without the terminating NUL */
    size_t cap;     /* bytes allocated at p */
} buf;

#define BUF_INIT {NULL, 0, 0}

void buf_init(buf *b);
void buf_free(buf *b);
void buf_reset(buf *b);
void buf_add(buf *b, const void *s, size_t n);
void buf_adds(buf *b, const char *s);
void buf_addc(buf *b, int c);
void buf_addf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_vaddf(buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
const char *buf_cstr(buf *b);
int buf_read_file(buf *b, const char *path);

#endif
