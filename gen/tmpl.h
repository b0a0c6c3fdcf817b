/*
** tmpl.h: the template engine (DESIGN.md 4.4). A template is text with {{ path }}, {% if %},
** {% for %}, {% include %} and {# comment #}; tmpl.c compiles it to a Lua function in which
** template line N is Lua line N, and the Lua module `tmpl` renders it into memory (never into
** files). Also the token interface between the re2c lexer (tmpl_lex.re) and the parser.
*/
#ifndef GEN_TMPL_H
#define GEN_TMPL_H

#include <stddef.h>

#include <lua.h>

#include "buf.h"   // defines: buf

/* -- Tokens (X-macro: kind, display name used in messages) -------------------------------- */

#define TMPL_TOKENS(_) \
    _(EOF,       "end of file") \
    _(ERROR,     "invalid input") \
    _(TEXT,      "text") \
    _(NEWLINE,   "newline") \
    _(COMMENT,   "comment") \
    _(OPEN_SUB,  "'{{'") \
    _(CLOSE_SUB, "'}}'") \
    _(OPEN_DIR,  "'{%'") \
    _(CLOSE_DIR, "'%}'") \
    _(NAME,      "name") \
    _(STRING,    "string") \
    _(INT,       "integer") \
    _(DOT,       "'.'") \
    _(LBRACKET,  "'['") \
    _(RBRACKET,  "']'") \
    _(IF,        "'if'") \
    _(ELIF,      "'elif'") \
    _(ELSE,      "'else'") \
    _(END,       "'end'") \
    _(FOR,       "'for'") \
    _(IN,        "'in'") \
    _(NOT,       "'not'") \
    _(INCLUDE,   "'include'") \
    _(WITH,      "'with'")

typedef enum {
#define TMPL_TK_ENUM(kind, name) TMPL_TK_##kind,
    TMPL_TOKENS(TMPL_TK_ENUM)
#undef TMPL_TK_ENUM
    TMPL_TK__COUNT
} tmpl_tk;

extern const char *const tmpl_tk_name[TMPL_TK__COUNT];

typedef struct tmpl_token {
    tmpl_tk kind;
    const char *p;      /* first byte in the source; a COMMENT spans "{#" to "#}" inclusive */
    size_t len;
    int line;           /* 1-based line of the first byte */
    int col;            /* 1-based byte column of the first byte */
} tmpl_token;

typedef struct tmpl_lexer {
    const unsigned char *src;   /* whole template, NUL-terminated at src[len] */
    const unsigned char *cur;   /* next byte to scan */
    const unsigned char *lim;   /* src + len: the sentinel NUL */
    const unsigned char *bol;   /* first byte of the current line */
    int line;                   /* line of 'cur' */
    int cond;                   /* re2c condition: text or code (generated enum) */
    const char *err;            /* message for the last TMPL_TK_ERROR */
    char errbuf[48];            /* room for a formatted 'err' */
} tmpl_lexer;

void tmpl_lex_init(tmpl_lexer *lx, const char *src, size_t len);
tmpl_tk tmpl_lex_next(tmpl_lexer *lx, tmpl_token *t);

/* -- Compiler ----------------------------------------------------------------------------- */

typedef struct tmpl_error {
    int line;           /* 1-based line of the error (0 when unknown) */
    int col;            /* 1-based byte column, 0 when unknown */
    char msg[256];
    const char *bol;    /* the source line holding the error (no newline), or NULL */
    size_t bol_len;
} tmpl_error;

int tmpl_compile_source(const char *path, const char *src, size_t len, const char *root,
                        buf *lua, tmpl_error *err, int warn);

/* -- Lua module --------------------------------------------------------------------------- */

int luaopen_tmpl(lua_State *L);

#endif
