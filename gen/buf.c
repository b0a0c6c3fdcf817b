/*
** buf.c: growable byte buffer (see buf.h). The buffer owns its bytes; buf_free releases them.
** Every append keeps p[len] == '\0', so b->p can be handed to C string functions (the
** content itself may hold NUL bytes: use len). Allocation failure is fatal (xrealloc).
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"    // defines: buf, buf_add, buf_addf, buf_read_file
#include "diag.h"   // defines: xrealloc

/*
** Make room for 'n' more bytes plus the terminating NUL; grows geometrically.
*/
static void buf_grow(buf *b, size_t n)
{
    size_t need = b->len + n + 1;
    if (need <= b->cap) return;
    if (need < b->len) xrealloc(NULL, (size_t)-1);   /* overflow: dies as out of memory */
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap = cap > ((size_t)-1) / 2 ? need : cap * 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

/*
** Initialise an empty buffer (no allocation until the first append).
*/
void buf_init(buf *b)
{
    b->p = NULL;
    b->len = b->cap = 0;
}

/*
** Release the bytes of 'b' and leave it empty and reusable.
*/
void buf_free(buf *b)
{
    free(b->p);
    buf_init(b);
}

/*
** Forget the content but keep the allocation.
*/
void buf_reset(buf *b)
{
    b->len = 0;
    if (b->p) b->p[0] = '\0';
}

/*
** Append 'n' bytes from 's' (which may hold NULs).
*/
void buf_add(buf *b, const void *s, size_t n)
{
    buf_grow(b, n);
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/*
** Append the C string 's'.
*/
void buf_adds(buf *b, const char *s)
{
    buf_add(b, s, strlen(s));
}

/*
** Append one byte.
*/
void buf_addc(buf *b, int c)
{
    buf_grow(b, 1);
    b->p[b->len++] = (char)c;
    b->p[b->len] = '\0';
}

/*
** Append printf-style output (short results go through a stack buffer, long ones are
** formatted again straight into the buffer).
*/
void buf_vaddf(buf *b, const char *fmt, va_list ap)
{
    char tmp[256];
    va_list aq;
    va_copy(aq, ap);
    int n = vsnprintf(tmp, sizeof tmp, fmt, aq);
    va_end(aq);
    if (n < 0) return;   /* encoding error: nothing sensible to append */
    if ((size_t)n < sizeof tmp) {
        buf_add(b, tmp, (size_t)n);
        return;
    }
    buf_grow(b, (size_t)n);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
}

/*
** Append printf-style output: buf_addf(b, "%s:%d", path, line).
*/
void buf_addf(buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    buf_vaddf(b, fmt, ap);
    va_end(ap);
}

/*
** The content as a NUL-terminated string ("" for a buffer never appended to). Valid until
** the next append or free.
*/
const char *buf_cstr(buf *b)
{
    return b->p ? b->p : "";
}

/*
** Append the whole content of the file at 'path' (as the OS resolves it) and NUL-terminate.
** Returns 0, or -1 with errno set (the buffer then holds whatever was read before the error).
*/
int buf_read_file(buf *b, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) return -1;
    for (;;) {
        buf_grow(b, 4096);
        size_t n = fread(b->p + b->len, 1, b->cap - b->len - 1, f);
        b->len += n;
        b->p[b->len] = '\0';
        if (n == 0) break;
    }
    int bad = ferror(f);
    int saved = errno;
    fclose(f);
    if (bad) {
        errno = saved ? saved : EIO;
        return -1;
    }
    return 0;
}
