/*
** tmpl_lex.re: the template lexer, re2c source (re2c -c: conditions <text> and <code>).
** Generated into build/obj/gen/tmpl_lex.c by gen/gen.mk; the #line directives re2c writes
** point compile errors back here. Scans a whole NUL-terminated template; knows no grammar:
** tmpl.c parses the tokens. Newlines are counted here, also inside comments and tags.
*/
#include <stdio.h>

#include "tmpl.h"   // defines: tmpl_lexer, tmpl_token, tmpl_tk, TMPL_TOKENS

/*!conditions:re2c*/

const char *const tmpl_tk_name[TMPL_TK__COUNT] = {
#define TMPL_TK_NAME(kind, name) name,
    TMPL_TOKENS(TMPL_TK_NAME)
#undef TMPL_TK_NAME
};

/*
** Start scanning 'src', which must hold 'len' bytes followed by a NUL (the sentinel). The
** lexer starts in text mode on line 1 and keeps pointers into 'src'.
*/
void tmpl_lex_init(tmpl_lexer *lx, const char *src, size_t len)
{
    lx->src = (const unsigned char *)src;
    lx->cur = lx->src;
    lx->lim = lx->src + len;
    lx->bol = lx->src;
    lx->line = 1;
    lx->cond = yyctext;
    lx->err = NULL;
    lx->errbuf[0] = '\0';
}

/* Count the newlines in [p, lx->cur) (a comment spanning lines). */
static void lex_lines(tmpl_lexer *lx, const unsigned char *p)
{
    for (; p < lx->cur; p++) {
        if (*p == '\n') {
            lx->line++;
            lx->bol = p + 1;
        }
    }
}

/*
** Scan the next token into 't' and return its kind. TMPL_TK_EOF repeats at the end of the
** input. TMPL_TK_ERROR sets lx->err (the first error ends the scan: callers stop there).
** In code mode (inside {{ }} or {% %}) blanks and newlines are skipped; at the end of the
** input there EOF is returned too, and the parser reports the unterminated tag.
*/
tmpl_tk tmpl_lex_next(tmpl_lexer *lx, tmpl_token *t)
{
    const unsigned char *YYMARKER;
    for (;;) {
        const unsigned char *tok = lx->cur;
        t->p = (const char *)tok;
        t->line = lx->line;
        t->col = (int)(tok - lx->bol) + 1;
#define LEX_RET(k) \
        do { t->kind = TMPL_TK_##k; t->len = (size_t)(lx->cur - tok); return t->kind; } while (0)
#define LEX_ERR(msg) do { lx->err = (msg); t->len = 1; LEX_RET(ERROR); } while (0)
    /*!re2c
        re2c:api:style = free-form;
        re2c:define:YYCTYPE = "unsigned char";
        re2c:define:YYCURSOR = "lx->cur";
        re2c:define:YYMARKER = "YYMARKER";
        re2c:define:YYGETCONDITION = "lx->cond";
        re2c:define:YYSETCONDITION = "lx->cond = @@;";
        re2c:yyfill:enable = 0;
        re2c:sentinel = 0;

        name    = [a-zA-Z_][a-zA-Z0-9_]*;
        text    = ([^{\n\x00] | "{" [^{%#\n\x00])+;
        comment = "{#" ([^#\x00] | "#"+ [^#}\x00])* "#"+ "}";
        string  = ["] ([^"\\\n\x00] | "\\" [\\"nt])* ["];

        <text> text         { LEX_RET(TEXT); }
        <text> "{"          { LEX_RET(TEXT); }
        <text> "\n"         { lx->line++; lx->bol = lx->cur; LEX_RET(NEWLINE); }
        <text> "{{" => code { LEX_RET(OPEN_SUB); }
        <text> "{%" => code { LEX_RET(OPEN_DIR); }
        <text> comment      { lex_lines(lx, tok); LEX_RET(COMMENT); }
        <text> "{#"         { LEX_ERR("unterminated comment: '{#' without '#}'"); }

        <code> [ \t\r]+     { continue; }
        <code> "\n"         { lx->line++; lx->bol = lx->cur; continue; }
        <code> "}}" => text { LEX_RET(CLOSE_SUB); }
        <code> "%}" => text { LEX_RET(CLOSE_DIR); }
        <code> "if"         { LEX_RET(IF); }
        <code> "elif"       { LEX_RET(ELIF); }
        <code> "else"       { LEX_RET(ELSE); }
        <code> "end"        { LEX_RET(END); }
        <code> "for"        { LEX_RET(FOR); }
        <code> "in"         { LEX_RET(IN); }
        <code> "not"        { LEX_RET(NOT); }
        <code> "include"    { LEX_RET(INCLUDE); }
        <code> "with"       { LEX_RET(WITH); }
        <code> name         { LEX_RET(NAME); }
        <code> [0-9]+       { LEX_RET(INT); }
        <code> "."          { LEX_RET(DOT); }
        <code> "["          { LEX_RET(LBRACKET); }
        <code> "]"          { LEX_RET(RBRACKET); }
        <code> string       { LEX_RET(STRING); }
        <code> ["]          {
            LEX_ERR("unterminated string literal (or an escape other than \\\\ \\\" \\n \\t)");
        }
        <code> [^\x00]      {
            unsigned c = tok[0];
            if (c >= 0x20 && c < 0x7f)
                snprintf(lx->errbuf, sizeof lx->errbuf, "unexpected character '%c'", (int)c);
            else
                snprintf(lx->errbuf, sizeof lx->errbuf, "unexpected byte 0x%02x", c);
            LEX_ERR(lx->errbuf);
        }

        <*> "\x00" {
            if (tok == lx->lim) {
                lx->cur = tok;   /* stay on the sentinel: EOF again next time */
                LEX_RET(EOF);
            }
            LEX_ERR("NUL byte in template");
        }
        <*> * { LEX_ERR("invalid byte"); }
    */
#undef LEX_RET
#undef LEX_ERR
    }
}
