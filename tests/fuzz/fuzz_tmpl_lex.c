/*
** fuzz_tmpl_lex.c: harness for the template lexer (gen/tmpl_lex.re): scans the input as a
** template to the end or the first error. Every token must lie inside the input, in order,
** with a known kind and a sane line and column, and the scan must end.
*/
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"   // defines: LLVMFuzzerTestOneInput, fz_bug
#include "tmpl.h"   // defines: tmpl_lex_init, tmpl_lex_next, tmpl_token

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *src = malloc(size + 1);   /* the lexer wants the whole text and a NUL sentinel */
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = 0;
    tmpl_lexer lx;
    tmpl_token t;
    tmpl_lex_init(&lx, src, size);
    const char *prev = src;
    int line = 1;
    for (size_t n = 0;; n++) {
        if (n > 2 * size + 2) fz_bug("%zu tokens from %zu bytes: the lexer loops", n, size);
        tmpl_tk k = tmpl_lex_next(&lx, &t);
        if (k != t.kind || k < 0 || k >= TMPL_TK__COUNT) fz_bug("token kind %d", (int)k);
        if (t.p < prev || t.p + t.len > src + size)
            fz_bug("token %zu (%s) at byte %td, %zu bytes: outside the input or backwards", n,
                   tmpl_tk_name[k], t.p - src, t.len);
        if (t.line < line || t.col < 1) fz_bug("token %zu at %d:%d", n, t.line, t.col);
        prev = t.p;
        line = t.line;
        if (k == TMPL_TK_ERROR && !lx.err) fz_bug("an error token without a message");
        if (k == TMPL_TK_EOF || k == TMPL_TK_ERROR) break;
    }
    free(src);
    return 0;
}
