/*
** tmpl.c: the template engine (DESIGN.md 4.4) and the Lua module `tmpl`.
** Parses the token stream of tmpl_lex.re and compiles it to Lua source in which template
** line N is Lua line N, so errors raised while rendering already read "path:N:". Renders into
** a buffer and returns a string: it never writes files and decides nothing (no arithmetic,
** no calls, no comparisons in templates). Used by the Lua passes (emit.lua) via require("tmpl").
*/
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <lauxlib.h>

#include "buf.h"    // defines: buf, buf_add, buf_addf, buf_read_file
#include "diag.h"   // defines: diag_warning, xmalloc, xrealloc
#include "host.h"   // defines: host_root
#include "tmpl.h"   // defines: tmpl_lexer, tmpl_token, tmpl_error, tmpl_compile_source

#define TMPL_CACHE_KEY  "gen.tmpl.cache"   /* registry: path -> compiled render function */
#define TMPL_OUT_META   "gen.tmpl.out"     /* metatable of the render state userdata */
#define TMPL_MAX_DEPTH  64                 /* include nesting (a cycle ends here) */

/* -- Paths ------------------------------------------------------------------------------- */

/*
** Check that 'p' is a repository-relative path spelled one way only: not empty, not
** absolute, no empty, "." or ".." components, no backslash, quote or control character.
** Returns NULL when fine, else what is wrong.
*/
static const char *tmpl_path_problem(const char *p, size_t n)
{
    if (n == 0) return "empty template path";
    if (p[0] == '/') return "template paths are relative to the repository root, not absolute";
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        unsigned char c = i < n ? (unsigned char)p[i] : '/';
        if (c < 0x20 || c == 0x7f || c == '"' || c == '\\')
            return "template path holds a quote, backslash or control character";
        if (c != '/') continue;
        size_t k = i - start;
        int dots = k <= 2 && p[start] == '.' && (k == 1 || p[start + 1] == '.');
        if (k == 0 || dots)
            return "template path has an empty, '.' or '..' component";
        start = i + 1;
    }
    return NULL;
}

/* -- Compiler state ---------------------------------------------------------------------- */

typedef struct loopvar {
    const char *name;   /* in the template source */
    size_t len;
    int id;             /* Lua locals t<id>, n<id>, i<id>, v<id> */
} loopvar;

typedef struct need {
    const char *name;   /* declared in the leading comment's "needs:" list */
    size_t len;
    int line;
    int used;
} need;

typedef struct compiler {
    const char *path;       /* template path as given (root-relative) */
    const char *src;        /* whole template, NUL-terminated */
    size_t len;
    const char *root;       /* repository root for include checks, or NULL (no checks) */
    tmpl_token *tok;        /* every token, ending with EOF or the first ERROR */
    unsigned char *drop;    /* per token: 1 = TEXT/NEWLINE of a directive-only line */
    size_t ntok, pos;
    buf *lua;               /* generated Lua source */
    int lualine;            /* line the end of 'lua' is on */
    loopvar *vars;          /* enclosing for-loop variables, innermost last */
    size_t nvars, capvars;
    int nloops;             /* for-loops compiled so far (unique local names) */
    need *needs;
    size_t nneeds, capneeds;
    int content_seen;       /* a tag or non-blank text came before (no leading comment) */
    const tmpl_token *lexerr;   /* the ERROR token ending 'tok', or NULL */
    const char *lexmsg;         /* its message */
    tmpl_error *err;
} compiler;

/*
** Record the error at token 't' (its line, column and source line); returns -1. Tokens end
** at the first lexer error: a parser error at or after it is the lexer error (re2c: only
** the first error in the file is reported).
*/
static int c_error(compiler *c, const tmpl_token *t, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int c_error(compiler *c, const tmpl_token *t, const char *fmt, ...)
{
    tmpl_error *e = c->err;
    if (e->msg[0] != '\0') return -1;   /* keep the first */
    if (c->lexerr != NULL && t->p >= c->lexerr->p) {
        t = c->lexerr;
        snprintf(e->msg, sizeof e->msg, "%s", c->lexmsg);
    } else {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    e->line = t->line;
    e->col = t->col;
    const char *p = t->p;
    while (p > c->src && p[-1] != '\n') p--;
    const char *q = t->p;
    while (*q && *q != '\n') q++;
    e->bol = p;
    e->bol_len = (size_t)(q - p);
    if (e->bol_len > 0 && p[e->bol_len - 1] == '\r') e->bol_len--;
    return -1;
}

static const tmpl_token *peek(compiler *c)
{
    return &c->tok[c->pos];
}

/* The stream ends with EOF or ERROR; neither is ever stepped over. */
static int at_end(const tmpl_token *t)
{
    return t->kind == TMPL_TK_EOF || t->kind == TMPL_TK_ERROR;
}

static const tmpl_token *peek2(compiler *c)
{
    return &c->tok[c->pos + !at_end(&c->tok[c->pos])];
}

static const tmpl_token *advance(compiler *c)
{
    const tmpl_token *t = &c->tok[c->pos];
    if (!at_end(t)) c->pos++;
    return t;
}

/* Keywords (if .. with in TMPL_TOKENS): reserved as variable names, fine as field names. */
static int is_keyword(tmpl_tk k)
{
    return k >= TMPL_TK_IF && k <= TMPL_TK_WITH;
}

/* How a token reads in a message: its text for names and keywords, else its kind. */
static int tok_show(const tmpl_token *t, char *out, size_t n)
{
    if (t->kind == TMPL_TK_NAME || t->kind == TMPL_TK_INT || is_keyword(t->kind))
        return snprintf(out, n, "'%.*s'", (int)(t->len > 40 ? 40 : t->len), t->p);
    return snprintf(out, n, "%s", tmpl_tk_name[t->kind]);
}

/*
** Expect a token of kind 'k' closing the tag opened by 'open'. At the end of the input the
** tag is unterminated (reported at the opener).
*/
static int expect_close(compiler *c, tmpl_tk k, const tmpl_token *open)
{
    const tmpl_token *t = peek(c);
    if (t->kind == k) {
        advance(c);
        return 0;
    }
    const char *o = k == TMPL_TK_CLOSE_SUB ? "{{" : "{%";
    const char *e = k == TMPL_TK_CLOSE_SUB ? "}}" : "%}";
    if (t->kind == TMPL_TK_EOF) return c_error(c, open, "unterminated '%s': missing '%s'", o, e);
    char got[64];
    tok_show(t, got, sizeof got);
    return c_error(c, t, "expected '%s' to close '%s' (line %d), got %s", e, o, open->line, got);
}

/* -- Lua source output -------------------------------------------------------------------- */

/* Emit newlines until the generated source is on template line 'line'. */
static void sync_line(compiler *c, int line)
{
    while (c->lualine < line) {
        buf_addc(c->lua, '\n');
        c->lualine++;
    }
}

static void emit(compiler *c, const char *s)
{
    buf_adds(c->lua, s);
}

static void emitf(compiler *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void emitf(compiler *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    buf_vaddf(c->lua, fmt, ap);
    va_end(ap);
}

/*
** Append bytes to 'b' as the inside of a Lua "..." literal. With 'real_newlines', a newline
** becomes backslash + newline (a newline in the string and in the source: template and Lua
** lines stay aligned; '*lines' counts them); otherwise it is written as \n.
*/
static void quote_into(buf *b, const char *s, size_t n, int real_newlines, int *lines)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        switch (ch) {
        case '"':  buf_adds(b, "\\\""); break;
        case '\\': buf_adds(b, "\\\\"); break;
        case '\t': buf_adds(b, "\\t"); break;
        case '\r': buf_adds(b, "\\r"); break;
        case '\n':
            if (real_newlines) {
                buf_adds(b, "\\\n");
                (*lines)++;
            } else {
                buf_adds(b, "\\n");
            }
            break;
        default:
            if (ch < 0x20 || ch == 0x7f) buf_addf(b, "\\%03u", ch);
            else buf_addc(b, ch);
        }
    }
}

static void emit_quoted(compiler *c, const char *s, size_t n)
{
    emit(c, "\"");
    quote_into(c->lua, s, n, 0, NULL);
    emit(c, "\"");
}

/*
** Decode the string literal token 't' ("..." with \\ \" \n \t) into 'out'.
*/
static void decode_string(const tmpl_token *t, buf *out)
{
    for (size_t i = 1; i + 1 < t->len; i++) {
        char ch = t->p[i];
        if (ch == '\\') {
            ch = t->p[++i];
            ch = ch == 'n' ? '\n' : ch == 't' ? '\t' : ch;
        }
        buf_addc(out, ch);
    }
}

/* -- needs: ------------------------------------------------------------------------------- */

static int is_ident_start(int ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
}

static int is_ident(int ch)
{
    return is_ident_start(ch) || (ch >= '0' && ch <= '9');
}

/* First 'word' in [p, end) not preceded by an identifier character (p[-1] is readable). */
static const char *find_word(const char *p, const char *end, const char *word)
{
    size_t n = strlen(word);
    for (; p + n <= end; p++) {
        if (memcmp(p, word, n) == 0 && !is_ident((unsigned char)p[-1])) return p;
    }
    return NULL;
}

/*
** Read the "needs:" list of the leading comment 't': comma-separated entries (commas inside
** parentheses do not separate), up to "emits:" or the end of the comment; each entry
** declares its leading identifier ("C_local (int)" declares C_local).
*/
static void parse_needs(compiler *c, const tmpl_token *t)
{
    const char *end = t->p + t->len - 2;    /* before "#}" */
    const char *p = find_word(t->p + 2, end, "needs:");
    if (p == NULL) return;
    p += 6;
    const char *stop = find_word(p, end, "emits:");
    if (stop != NULL) end = stop;
    int line = t->line;
    for (const char *q = t->p; q < p; q++) line += *q == '\n';
    int depth = 0, at_entry = 1;
    for (; p < end; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch == '\n') line++;
        if (ch == '(') depth++;
        else if (ch == ')' && depth > 0) depth--;
        else if (ch == ',' && depth == 0) at_entry = 1;
        else if (at_entry && is_ident_start(ch)) {
            const char *s = p;
            while (p < end && is_ident((unsigned char)*p)) p++;
            if (c->nneeds == c->capneeds) {
                c->capneeds = c->capneeds ? 2 * c->capneeds : 8;
                c->needs = xrealloc(c->needs, c->capneeds * sizeof *c->needs);
            }
            c->needs[c->nneeds++] = (need){s, (size_t)(p - s), line, 0};
            at_entry = 0;
            p--;
        } else if (ch != ' ' && ch != '\t' && ch != '\r' && ch != '\n') {
            at_entry = 0;
        }
    }
}

static void mark_used(compiler *c, const char *name, size_t len)
{
    for (size_t i = 0; i < c->nneeds; i++) {
        if (c->needs[i].len == len && memcmp(c->needs[i].name, name, len) == 0)
            c->needs[i].used = 1;
    }
}

/* -- Paths: name(.name | [integer])* -------------------------------------------------------- */

/*
** Parse a path and put into 'expr' the Lua expression that looks it up and into 'show' its
** canonical spelling (a.b[2]). The head resolves to the innermost loop variable of that
** name, else TEMPLATE (this template's path), else the environment.
*/
static int parse_path(compiler *c, buf *expr, buf *show)
{
    const tmpl_token *t = advance(c);
    char got[64];
    if (t->kind != TMPL_TK_NAME) {
        tok_show(t, got, sizeof got);
        if (is_keyword(t->kind))
            return c_error(c, t, "%s is a keyword, not a variable name", got);
        return c_error(c, t, "expected a variable name, got %s", got);
    }
    buf_reset(expr);
    buf_reset(show);
    buf_add(show, t->p, t->len);
    mark_used(c, t->p, t->len);
    int found = 0;
    for (size_t i = c->nvars; i-- > 0;) {
        if (c->vars[i].len == t->len && memcmp(c->vars[i].name, t->p, t->len) == 0) {
            buf_addf(expr, "v%d", c->vars[i].id);
            found = 1;
            break;
        }
    }
    int is_template = !found && t->len == 8 && memcmp(t->p, "TEMPLATE", 8) == 0;
    if (is_template) {
        buf_addc(expr, '"');
        quote_into(expr, c->path, strlen(c->path), 0, NULL);
        buf_addc(expr, '"');
    } else if (!found) {
        buf_addf(expr, "_g(E,\"%.*s\")", (int)t->len, t->p);
    }
    buf wrap = BUF_INIT;
    int rc = 0;
    for (;;) {
        const tmpl_token *sep = peek(c);
        if (sep->kind != TMPL_TK_DOT && sep->kind != TMPL_TK_LBRACKET) break;
        if (is_template) {
            rc = c_error(c, sep, "TEMPLATE is a string (this template's path): it has no fields");
            break;
        }
        advance(c);
        size_t plen = show->len;
        const tmpl_token *k = advance(c);
        buf_reset(&wrap);
        if (sep->kind == TMPL_TK_DOT) {
            if (k->kind != TMPL_TK_NAME && !is_keyword(k->kind)) {
                tok_show(k, got, sizeof got);
                rc = c_error(c, k, "expected a field name after '.', got %s", got);
                break;
            }
            buf_addc(show, '.');
            buf_add(show, k->p, k->len);
            buf_addf(&wrap, "_x(%s,\"%.*s\",", buf_cstr(expr), (int)k->len, k->p);
        } else {
            if (k->kind != TMPL_TK_INT) {
                tok_show(k, got, sizeof got);
                rc = c_error(c, k, "expected an integer index after '[', got %s", got);
                break;
            }
            if (k->len > 15) {
                rc = c_error(c, k, "index too large");
                break;
            }
            const tmpl_token *r = advance(c);
            if (r->kind != TMPL_TK_RBRACKET) {
                tok_show(r, got, sizeof got);
                rc = c_error(c, r, "expected ']' after the index, got %s", got);
                break;
            }
            buf_addf(show, "[%.*s]", (int)k->len, k->p);
            buf_addf(&wrap, "_x(%s,%.*s,", buf_cstr(expr), (int)k->len, k->p);
        }
        buf_addf(&wrap, "\"%s\",%zu)", buf_cstr(show), plen);
        buf_reset(expr);
        buf_add(expr, wrap.p, wrap.len);
    }
    buf_free(&wrap);
    return rc;
}

/* -- Statements --------------------------------------------------------------------------- */

static int parse_block(compiler *c, tmpl_tk *stop);

/* Emit the run of kept TEXT/NEWLINE tokens starting at c->pos as one _w call. */
static void compile_text(compiler *c)
{
    int started = 0;
    int line = peek(c)->line;
    for (;;) {
        const tmpl_token *t = peek(c);
        if (t->kind != TMPL_TK_TEXT && t->kind != TMPL_TK_NEWLINE) break;
        if (!c->drop[c->pos]) {
            if (t->kind == TMPL_TK_TEXT) {
                for (size_t i = 0; i < t->len && !c->content_seen; i++)
                    c->content_seen = strchr(" \t\r", t->p[i]) == NULL;
            }
            if (!started) {
                sync_line(c, t->line);
                line = t->line;
                emit(c, "_w(O,\"");
                started = 1;
            }
            quote_into(c->lua, t->p, t->len, 1, &c->lualine);
        }
        advance(c);
    }
    if (started) emitf(c, "\",%d) ", line);
}

/* {{ path }} or {{ "literal" }}; the '{{' is consumed. */
static int compile_subst(compiler *c, const tmpl_token *open)
{
    const tmpl_token *t = peek(c);
    sync_line(c, open->line);
    if (t->kind == TMPL_TK_STRING) {
        advance(c);
        buf s = BUF_INIT;
        decode_string(t, &s);
        emit(c, "_w(O,");
        emit_quoted(c, s.p ? s.p : "", s.len);
        emitf(c, ",%d) ", open->line);
        buf_free(&s);
        return expect_close(c, TMPL_TK_CLOSE_SUB, open);
    }
    if (t->kind != TMPL_TK_NAME && !is_keyword(t->kind)) {
        char got[64];
        tok_show(t, got, sizeof got);
        if (t->kind == TMPL_TK_EOF) return expect_close(c, TMPL_TK_CLOSE_SUB, open);
        return c_error(c, t, "expected a variable or a \"string\" after '{{', got %s (a literal "
                       "'{{' is written {{ \"{{\" }})", got);
    }
    buf expr = BUF_INIT, show = BUF_INIT;
    int rc = parse_path(c, &expr, &show);
    if (rc == 0) {
        emitf(c, "_s(O,%s,\"%s\",%d) ", buf_cstr(&expr), buf_cstr(&show), open->line);
        rc = expect_close(c, TMPL_TK_CLOSE_SUB, open);
    }
    buf_free(&expr);
    buf_free(&show);
    return rc;
}

/* [not] path -> "_b(expr,"kw [not ]path")" into 'cond'. */
static int parse_cond(compiler *c, const char *kw, buf *cond)
{
    int neg = 0;
    if (peek(c)->kind == TMPL_TK_NOT) {
        advance(c);
        neg = 1;
    }
    buf expr = BUF_INIT, show = BUF_INIT;
    int rc = parse_path(c, &expr, &show);
    if (rc == 0)
        buf_addf(cond, "%s_b(%s,\"%s %s%s\")", neg ? "not " : "", buf_cstr(&expr), kw,
                 neg ? "not " : "", buf_cstr(&show));
    buf_free(&expr);
    buf_free(&show);
    return rc;
}

/* {% if %} ... {% elif %} ... {% else %} ... {% end %}; 'open' is the '{%'. */
static int compile_if(compiler *c, const tmpl_token *open)
{
    buf cond = BUF_INIT;
    int rc = parse_cond(c, "if", &cond);
    if (rc == 0) rc = expect_close(c, TMPL_TK_CLOSE_DIR, open);
    if (rc == 0) {
        sync_line(c, open->line);
        emitf(c, "if %s then ", buf_cstr(&cond));
    }
    int seen_else = 0;
    while (rc == 0) {
        tmpl_tk stop;
        if (parse_block(c, &stop) != 0) {
            rc = -1;
            break;
        }
        const tmpl_token *o = advance(c);   /* the '{%' of elif/else/end, or EOF */
        if (stop == TMPL_TK_EOF) {
            rc = c_error(c, open, "'{%% if %%}' is never closed: missing '{%% end %%}'");
            break;
        }
        const tmpl_token *kw = advance(c);
        if (stop == TMPL_TK_END) {
            rc = expect_close(c, TMPL_TK_CLOSE_DIR, o);
            sync_line(c, o->line);
            emit(c, "end ");
            break;
        }
        if (seen_else) {
            rc = c_error(c, kw, "'%s' after '{%% else %%}' (the 'if' is on line %d)",
                         stop == TMPL_TK_ELIF ? "elif" : "else", open->line);
            break;
        }
        if (stop == TMPL_TK_ELSE) {
            seen_else = 1;
            rc = expect_close(c, TMPL_TK_CLOSE_DIR, o);
            sync_line(c, o->line);
            emit(c, "else ");
        } else {
            buf_reset(&cond);
            rc = parse_cond(c, "elif", &cond);
            if (rc == 0) rc = expect_close(c, TMPL_TK_CLOSE_DIR, o);
            sync_line(c, o->line);
            emitf(c, "elseif %s then ", buf_cstr(&cond));
        }
    }
    buf_free(&cond);
    return rc;
}

/* {% for x in path %} ... {% end %}; 'open' is the '{%'. */
static int compile_for(compiler *c, const tmpl_token *open)
{
    const tmpl_token *var = advance(c);
    char got[64];
    if (var->kind != TMPL_TK_NAME) {
        tok_show(var, got, sizeof got);
        return c_error(c, var, "expected a loop variable name after 'for', got %s", got);
    }
    if (var->len == 8 && memcmp(var->p, "TEMPLATE", 8) == 0)
        return c_error(c, var, "TEMPLATE is reserved: choose another loop variable name");
    const tmpl_token *in = advance(c);
    if (in->kind != TMPL_TK_IN) {
        tok_show(in, got, sizeof got);
        return c_error(c, in, "expected 'in' after the loop variable, got %s", got);
    }
    buf expr = BUF_INIT, show = BUF_INIT;
    int rc = parse_path(c, &expr, &show);
    if (rc == 0) rc = expect_close(c, TMPL_TK_CLOSE_DIR, open);
    if (rc == 0) {
        int id = ++c->nloops;
        sync_line(c, open->line);
        emitf(c, "do local t%d,n%d=_a(%s,\"for %.*s in %s\") for i%d=1,n%d do local v%d=t%d[i%d] ",
              id, id, buf_cstr(&expr), (int)var->len, var->p, buf_cstr(&show), id, id, id, id, id);
        if (c->nvars == c->capvars) {
            c->capvars = c->capvars ? 2 * c->capvars : 8;
            c->vars = xrealloc(c->vars, c->capvars * sizeof *c->vars);
        }
        c->vars[c->nvars++] = (loopvar){var->p, var->len, id};
        tmpl_tk stop;
        rc = parse_block(c, &stop);
        c->nvars--;
        if (rc == 0) {
            const tmpl_token *o = advance(c);
            const tmpl_token *kw = advance(c);
            if (stop == TMPL_TK_EOF) {
                rc = c_error(c, open, "'{%% for %%}' is never closed: missing '{%% end %%}'");
            } else if (stop != TMPL_TK_END) {
                rc = c_error(c, kw, "'%s' inside '{%% for %%}' (line %d): it belongs to an "
                             "'{%% if %%}'", stop == TMPL_TK_ELIF ? "elif" : "else", open->line);
            } else {
                rc = expect_close(c, TMPL_TK_CLOSE_DIR, o);
                sync_line(c, o->line);
                emit(c, "end end ");
            }
        }
    }
    buf_free(&expr);
    buf_free(&show);
    return rc;
}

/* {% include "path" [with path] %}; 'open' is the '{%'. */
static int compile_include(compiler *c, const tmpl_token *open)
{
    const tmpl_token *t = advance(c);
    if (t->kind != TMPL_TK_STRING) {
        char got[64];
        tok_show(t, got, sizeof got);
        return c_error(c, t, "expected a \"template path\" after 'include', got %s", got);
    }
    buf path = BUF_INIT, expr = BUF_INIT, show = BUF_INIT;
    decode_string(t, &path);
    const char *why = tmpl_path_problem(buf_cstr(&path), path.len);
    int rc = 0;
    if (why != NULL) {
        rc = c_error(c, t, "bad include path \"%s\": %s", buf_cstr(&path), why);
    } else if (c->root != NULL) {
        buf full = BUF_INIT;
        buf_addf(&full, "%s/%s", c->root, buf_cstr(&path));
        struct stat st;
        if (stat(buf_cstr(&full), &st) != 0)
            rc = c_error(c, t, "cannot include '%s': %s", buf_cstr(&path), strerror(errno));
        else if (!S_ISREG(st.st_mode))
            rc = c_error(c, t, "cannot include '%s': not a regular file", buf_cstr(&path));
        buf_free(&full);
    }
    int with = 0;
    if (rc == 0 && peek(c)->kind == TMPL_TK_WITH) {
        advance(c);
        with = 1;
        rc = parse_path(c, &expr, &show);
    }
    if (rc == 0) rc = expect_close(c, TMPL_TK_CLOSE_DIR, open);
    if (rc == 0) {
        sync_line(c, open->line);
        emit(c, "_i(O,");
        emit_quoted(c, path.p, path.len);
        if (with) {
            emitf(c, ",%s,\"include \\\"", buf_cstr(&expr));
            quote_into(c->lua, path.p, path.len, 0, NULL);
            emitf(c, "\\\" with %s\") ", buf_cstr(&show));
        } else {
            emit(c, ",E) ");
        }
    }
    buf_free(&path);
    buf_free(&expr);
    buf_free(&show);
    return rc;
}

/*
** Compile items until the end of the input or a '{% elif/else/end %}', which is left
** unconsumed; '*stop' tells which (TMPL_TK_EOF, ELIF, ELSE or END).
*/
static int parse_block(compiler *c, tmpl_tk *stop)
{
    for (;;) {
        const tmpl_token *t = peek(c);
        switch (t->kind) {
        case TMPL_TK_EOF:
            *stop = TMPL_TK_EOF;
            return 0;
        case TMPL_TK_TEXT:
        case TMPL_TK_NEWLINE:
            compile_text(c);
            break;
        case TMPL_TK_COMMENT:
            if (!c->content_seen && c->nneeds == 0) parse_needs(c, t);
            c->content_seen = 1;
            advance(c);
            break;
        case TMPL_TK_OPEN_SUB:
            c->content_seen = 1;
            advance(c);
            if (compile_subst(c, t) != 0) return -1;
            break;
        case TMPL_TK_OPEN_DIR: {
            c->content_seen = 1;
            tmpl_tk k = peek2(c)->kind;
            if (k == TMPL_TK_ELIF || k == TMPL_TK_ELSE || k == TMPL_TK_END) {
                *stop = k;
                return 0;
            }
            advance(c);
            const tmpl_token *kw = advance(c);
            int rc;
            if (k == TMPL_TK_IF) rc = compile_if(c, t);
            else if (k == TMPL_TK_FOR) rc = compile_for(c, t);
            else if (k == TMPL_TK_INCLUDE) rc = compile_include(c, t);
            else if (k == TMPL_TK_EOF) rc = c_error(c, t, "unterminated '{%%': missing '%%}'");
            else if (k == TMPL_TK_NAME)
                rc = c_error(c, kw, "unknown directive '%.*s' (expected if, elif, else, end, "
                             "for or include)", (int)(kw->len > 40 ? 40 : kw->len), kw->p);
            else {
                char got[64];
                tok_show(kw, got, sizeof got);
                rc = c_error(c, kw, "expected a directive after '{%%', got %s", got);
            }
            if (rc != 0) return -1;
            break;
        }
        default: {
            char got[64];
            tok_show(t, got, sizeof got);
            return c_error(c, t, "unexpected %s outside '{{ }}' and '{%% %%}'", got);
        }
        }
    }
}

/* -- Directive-only lines ----------------------------------------------------------------- */

/*
** Mark the TEXT and NEWLINE tokens of every line that holds directives ({% %}, {# #}) and
** only blanks besides (no {{ }}, no other text): such a line emits nothing, not even its
** newline. A line runs from one NEWLINE token to the next, so the lines a multi-line comment
** or tag spans count as one.
*/
static void mark_dropped(compiler *c)
{
    size_t i = 0;
    while (i < c->ntok) {
        size_t j = i;
        int dir = 0, content = 0;
        for (; j < c->ntok; j++) {
            const tmpl_token *t = &c->tok[j];
            if (t->kind == TMPL_TK_OPEN_DIR || t->kind == TMPL_TK_COMMENT) dir = 1;
            else if (t->kind == TMPL_TK_OPEN_SUB) content = 1;
            else if (t->kind == TMPL_TK_TEXT) {
                for (size_t k = 0; k < t->len; k++)
                    if (t->p[k] != ' ' && t->p[k] != '\t' && t->p[k] != '\r') content = 1;
            }
            if (t->kind == TMPL_TK_NEWLINE || t->kind == TMPL_TK_EOF) break;
        }
        if (dir && !content) {
            for (size_t k = i; k <= j && k < c->ntok; k++) {
                tmpl_tk kind = c->tok[k].kind;
                c->drop[k] = kind == TMPL_TK_TEXT || kind == TMPL_TK_NEWLINE;
            }
        }
        i = j + 1;
    }
}

/* -- Compiler entry ----------------------------------------------------------------------- */

/* Source prologue (on line 1): the chunk takes the helpers and returns the render function. */
#define TMPL_PROLOGUE "local _w,_s,_g,_x,_b,_a,_i=...;return function(O,E) "

/*
** Compile template 'path' (root-relative, for messages and TEMPLATE), whose text is 'src'
** ('len' bytes + NUL), into Lua source appended to 'lua'. When 'root' is not NULL, included
** files must exist under it. With 'warn', unused "needs:" names are reported on stderr.
** Returns 0, or -1 with the first error in 'err' (err->bol points into 'src').
*/
int tmpl_compile_source(const char *path, const char *src, size_t len, const char *root,
                        buf *lua, tmpl_error *err, int warn)
{
    compiler c;
    memset(&c, 0, sizeof c);
    memset(err, 0, sizeof *err);
    c.path = path;
    c.src = src;
    c.len = len;
    c.root = root;
    c.lua = lua;
    c.lualine = 1;
    c.err = err;

    tmpl_lexer lx;
    tmpl_lex_init(&lx, src, len);
    size_t cap = 0;
    for (;;) {
        if (c.ntok == cap) {
            cap = cap ? 2 * cap : 256;
            c.tok = xrealloc(c.tok, cap * sizeof *c.tok);
        }
        tmpl_token *t = &c.tok[c.ntok++];
        tmpl_lex_next(&lx, t);
        if (t->kind == TMPL_TK_ERROR) {
            c.lexmsg = lx.err;
            break;
        }
        if (t->kind == TMPL_TK_EOF) break;
    }
    if (c.tok[c.ntok - 1].kind == TMPL_TK_ERROR) c.lexerr = &c.tok[c.ntok - 1];

    c.drop = xmalloc(c.ntok);
    memset(c.drop, 0, c.ntok);
    mark_dropped(&c);
    emit(&c, TMPL_PROLOGUE);
    tmpl_tk stop;
    int rc = parse_block(&c, &stop);
    if (rc == 0 && stop != TMPL_TK_EOF) {
        const tmpl_token *kw = peek2(&c);
        rc = c_error(&c, kw, "'{%% %s %%}' without an open '{%% if %%}'%s",
                     stop == TMPL_TK_END ? "end" : stop == TMPL_TK_ELSE ? "else" : "elif",
                     stop == TMPL_TK_END ? " or '{% for %}'" : "");
    }
    if (rc == 0) {
        sync_line(&c, c.tok[c.ntok - 1].line);   /* up to the EOF: same line count */
        emit(&c, "end\n");
    }
    if (rc == 0 && warn) {
        for (size_t i = 0; i < c.nneeds; i++) {
            if (!c.needs[i].used)
                diag_warning(path, c.needs[i].line, "'%.*s' declared in needs: but never used",
                             (int)c.needs[i].len, c.needs[i].name);
        }
    }
    free(c.tok);
    free(c.drop);
    free(c.vars);
    free(c.needs);
    return rc;
}

/* -- Rendering ---------------------------------------------------------------------------- */

typedef struct tmpl_out {
    buf b;                  /* the rendered text */
    int line_dirs;          /* emit #line directives */
    int depth;              /* include nesting */
    const char *path;       /* template being rendered (a string alive during the render) */
    const char *map_path;   /* #line state: what the next output line maps to */
    long map_line;
    int at_bol;             /* output is at the start of a line */
} tmpl_out;

static int out_gc(lua_State *L)
{
    tmpl_out *o = luaL_checkudata(L, 1, TMPL_OUT_META);
    buf_free(&o->b);
    return 0;
}

static tmpl_out *out_check(lua_State *L)
{
    return luaL_checkudata(L, 1, TMPL_OUT_META);
}

/*
** Append 's' produced by template line 'line'. With line_dirs, a line of output that does
** not continue the current #line mapping is preceded by "#line N "path"" (not after a line
** ending in a backslash, which would break a macro). 'text' is template text, whose
** lines follow the template's; a substituted value is checked only where it starts.
*/
static void out_write(tmpl_out *o, const char *s, size_t n, long line, int text)
{
    if (!o->line_dirs) {
        buf_add(&o->b, s, n);
        return;
    }
    int first = 1;
    while (n > 0) {
        if (o->at_bol && (text || first)
            && (o->map_path == NULL || o->map_line != line || strcmp(o->map_path, o->path) != 0)
            && !(o->b.len >= 2 && o->b.p[o->b.len - 2] == '\\')) {
            buf_addf(&o->b, "#line %ld \"%s\"\n", line, o->path);
            o->map_path = o->path;
            o->map_line = line;
        }
        const char *nl = memchr(s, '\n', n);
        size_t k = nl ? (size_t)(nl - s) + 1 : n;
        buf_add(&o->b, s, k);
        o->at_bol = nl != NULL;
        if (nl != NULL) {
            o->map_line++;
            line += text;
        }
        s += k;
        n -= k;
        first = 0;
    }
}

/* _w(O, text, line): template text. */
static int h_text(lua_State *L)
{
    tmpl_out *o = out_check(L);
    size_t n;
    const char *s = lua_tolstring(L, 2, &n);
    out_write(o, s, n, (long)lua_tointeger(L, 3), 1);
    return 0;
}

/* _s(O, value, "path", line): {{ path }}; only strings and integers. */
static int h_subst(lua_State *L)
{
    tmpl_out *o = out_check(L);
    const char *show = lua_tostring(L, 3);
    long line = (long)lua_tointeger(L, 4);
    if (lua_type(L, 2) == LUA_TSTRING) {
        size_t n;
        const char *s = lua_tolstring(L, 2, &n);
        out_write(o, s, n, line, 0);
    } else if (lua_isinteger(L, 2)) {
        char num[32];
        int n = snprintf(num, sizeof num, LUA_INTEGER_FMT, (LUAI_UACINT)lua_tointeger(L, 2));
        out_write(o, num, (size_t)n, line, 0);
    } else {
        const char *what = luaL_typename(L, 2), *hint;
        switch (lua_type(L, 2)) {
        case LUA_TNUMBER:
            what = "float";
            hint = "format it in Lua";
            break;
        case LUA_TBOOLEAN:
            hint = "test it with {% if %} or turn it into a string in Lua";
            break;
        case LUA_TTABLE:
            hint = "substitute one of its fields, or loop over it with {% for %}";
            break;
        default:
            hint = "only strings and integers can be substituted";
        }
        return luaL_error(L, "%s value for '{{ %s }}': %s", what, show, hint);
    }
    return 0;
}

/* _g(E, "name"): a name of the environment; nil is an error. */
static int h_get(lua_State *L)
{
    const char *name = lua_tostring(L, 2);
    if (lua_getfield(L, 1, name) == LUA_TNIL)
        return luaL_error(L, "undefined variable '%s'", name);
    return 1;
}

/* _x(t, key, "a.b", #"a"): field or element of t; non-table and nil are errors. */
static int h_index(lua_State *L)
{
    const char *show = lua_tostring(L, 3);
    lua_Integer plen = lua_tointeger(L, 4);
    if (!lua_istable(L, 1)) {
        lua_pushlstring(L, show, (size_t)plen);
        return luaL_error(L, "'%s' is a %s value, not a table (in '%s')", lua_tostring(L, -1),
                          luaL_typename(L, 1), show);
    }
    lua_pushvalue(L, 2);
    if (lua_gettable(L, 1) == LUA_TNIL) return luaL_error(L, "undefined variable '%s'", show);
    return 1;
}

/* _b(value, "if a.b"): a condition; must be a boolean. */
static int h_bool(lua_State *L)
{
    if (lua_type(L, 1) != LUA_TBOOLEAN)
        return luaL_error(L, "'{%% %s %%}' needs a boolean, got a %s value: compute the "
                          "condition in Lua", lua_tostring(L, 2), luaL_typename(L, 1));
    lua_settop(L, 1);
    return 1;
}

/*
** _a(value, "for x in a"): returns the array and its length. A table without a metatable
** must hold exactly the keys 1..n; with a metatable, #t (its __len) is trusted.
*/
static int h_array(lua_State *L)
{
    const char *show = lua_tostring(L, 2);
    if (!lua_istable(L, 1))
        return luaL_error(L, "'{%% %s %%}' needs an array, got a %s value", show,
                          luaL_typename(L, 1));
    lua_Integer n;
    if (lua_getmetatable(L, 1)) {
        lua_pop(L, 1);
        n = luaL_len(L, 1);
    } else {
        n = (lua_Integer)lua_rawlen(L, 1);
        lua_Integer count = 0;   /* keys seen; with keys only in 1..n, count == n */
        int other = 0;           /* a key outside 1..n */
        lua_pushnil(L);
        while (lua_next(L, 1)) {
            lua_pop(L, 1);
            count++;
            if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1 || lua_tointeger(L, -1) > n)
                other = 1;
        }
        if (other || count != n)
            return luaL_error(L, "'{%% %s %%}' needs an array, got a table with keys other "
                              "than 1..n (iterate a list built in Lua)", show);
    }
    lua_settop(L, 1);
    lua_pushinteger(L, n);
    return 2;
}

static void tmpl_push_compiled(lua_State *L, const char *path);

/* _i(O, "path", env [, "include ... with x"]): render another template into O. */
static int h_include(lua_State *L)
{
    tmpl_out *o = out_check(L);
    const char *path = lua_tostring(L, 2);
    if (!lua_istable(L, 3))
        return luaL_error(L, "'{%% %s %%}' needs a table, got a %s value", lua_tostring(L, 4),
                          luaL_typename(L, 3));
    if (o->depth >= TMPL_MAX_DEPTH)
        return luaL_error(L, "includes nested deeper than %d (does '%s' include itself?)",
                          TMPL_MAX_DEPTH, path);
    tmpl_push_compiled(L, path);
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 3);
    const char *outer = o->path;
    o->path = path;   /* a constant of the calling template: alive during the call */
    o->depth++;
    lua_call(L, 2, 0);
    o->depth--;
    o->path = outer;
    return 0;
}

/* -- Compiling from Lua ------------------------------------------------------------------- */

/*
** Raise the compile error 'e' of template 'path' as a located error object
** {file=, line=, col=, msg=, source=} (the shape main.c prints as "file:line: error: msg").
*/
static int tmpl_raise(lua_State *L, const char *path, const tmpl_error *e)
{
    lua_createtable(L, 0, 5);
    lua_pushstring(L, path);
    lua_setfield(L, -2, "file");
    lua_pushinteger(L, e->line);
    lua_setfield(L, -2, "line");
    lua_pushstring(L, e->msg);
    lua_setfield(L, -2, "msg");
    if (e->col > 0) {
        lua_pushinteger(L, e->col);
        lua_setfield(L, -2, "col");
    }
    if (e->bol != NULL) {
        lua_pushlstring(L, e->bol, e->bol_len);
        lua_setfield(L, -2, "source");
    }
    return lua_error(L);
}

/*
** Read template 'path' (root-relative) and compile it to Lua source; pushes the source.
** Unreadable files raise a string error at the caller's position; template errors raise
** the located error object (tmpl_raise).
*/
static void tmpl_push_source(lua_State *L, const char *path, int warn)
{
    const char *why = tmpl_path_problem(path, strlen(path));
    if (why != NULL) luaL_error(L, "bad template path '%s': %s", path, why);
    const char *root = host_root(L);
    buf full = BUF_INIT, src = BUF_INIT, lua = BUF_INIT;
    buf_addf(&full, "%s/%s", root, path);
    if (buf_read_file(&src, buf_cstr(&full)) != 0) {
        int e = errno;
        buf_free(&full);
        buf_free(&src);
        luaL_error(L, "cannot read template '%s': %s", path, strerror(e));
    }
    buf_free(&full);
    tmpl_error err;
    if (tmpl_compile_source(path, buf_cstr(&src), src.len, root, &lua, &err, warn) != 0) {
        buf_free(&lua);
        /* copy the source line out before the template text is freed */
        lua_pushlstring(L, err.bol ? err.bol : "", err.bol ? err.bol_len : 0);
        buf_free(&src);
        if (err.bol != NULL) err.bol = lua_tostring(L, -1);
        tmpl_raise(L, path, &err);
    }
    buf_free(&src);
    lua_pushlstring(L, buf_cstr(&lua), lua.len);
    buf_free(&lua);
}

/*
** Push the render function of template 'path': from the cache, or compiled now (unused
** needs: are reported once, at that compile) and cached.
*/
static void tmpl_push_compiled(lua_State *L, const char *path)
{
    lua_getfield(L, LUA_REGISTRYINDEX, TMPL_CACHE_KEY);
    if (lua_getfield(L, -1, path) == LUA_TFUNCTION) {
        lua_remove(L, -2);
        return;
    }
    lua_pop(L, 1);
    tmpl_push_source(L, path, 1);
    size_t n;
    const char *lua = lua_tolstring(L, -1, &n);
    lua_pushfstring(L, "@%s", path);
    if (luaL_loadbufferx(L, lua, n, lua_tostring(L, -1), "t") != LUA_OK)
        luaL_error(L, "%s: generated Lua does not load (a tmpl.c bug): %s", path,
                   lua_tostring(L, -1));
    static const lua_CFunction helpers[] = {
        h_text, h_subst, h_get, h_index, h_bool, h_array, h_include   /* ORDER TMPL_PROLOGUE */
    };
    for (size_t i = 0; i < sizeof helpers / sizeof helpers[0]; i++)
        lua_pushcfunction(L, helpers[i]);
    lua_call(L, (int)(sizeof helpers / sizeof helpers[0]), 1);
    lua_pushvalue(L, -1);
    lua_setfield(L, -5, path);   /* cache[path] = render function */
    lua_replace(L, -4);
    lua_pop(L, 2);
}

/*
** Render the template at stack index 'pidx' (a path string) with the environment table at
** 'eidx' and options at 'oidx' (nil or a table: line_dirs = boolean). Pushes the result.
*/
static int tmpl_render_at(lua_State *L, int pidx, int eidx, int oidx)
{
    const char *path = lua_tostring(L, pidx);
    luaL_checktype(L, eidx, LUA_TTABLE);
    int line_dirs = 0;
    if (!lua_isnoneornil(L, oidx)) {
        luaL_checktype(L, oidx, LUA_TTABLE);
        lua_getfield(L, oidx, "line_dirs");
        line_dirs = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    tmpl_push_compiled(L, path);
    tmpl_out *o = lua_newuserdatauv(L, sizeof *o, 0);
    memset(o, 0, sizeof *o);
    buf_init(&o->b);
    luaL_setmetatable(L, TMPL_OUT_META);
    o->line_dirs = line_dirs;
    o->path = path;   /* the argument string stays on the stack during the render */
    o->at_bol = 1;
    lua_pushvalue(L, eidx);
    lua_call(L, 2, 0);
    lua_pushlstring(L, buf_cstr(&o->b), o->b.len);
    buf_free(&o->b);
    return 1;
}

/*
** tmpl.render(path, env [, options]) -> string. 'path' is relative to the repository root;
** 'env' is a table; options.line_dirs = true adds #line directives (see out_write).
*/
static int l_render(lua_State *L)
{
    luaL_checkstring(L, 1);
    lua_settop(L, 3);
    return tmpl_render_at(L, 1, 2, 3);
}

static int l_compiled(lua_State *L)
{
    lua_settop(L, 2);
    return tmpl_render_at(L, lua_upvalueindex(1), 1, 2);
}

/*
** tmpl.compile(path) -> function(env [, options]) -> string. Compiles now (errors now),
** through the same cache as render.
*/
static int l_compile(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    tmpl_push_compiled(L, path);
    lua_pop(L, 1);
    lua_pushvalue(L, 1);
    lua_pushcclosure(L, l_compiled, 1);
    return 1;
}

/*
** tmpl.lua_source(path) -> the Lua source the template compiles to (for debugging; line N
** of it is line N of the template). Not cached, no warnings.
*/
static int l_lua_source(lua_State *L)
{
    tmpl_push_source(L, luaL_checkstring(L, 1), 0);
    return 1;
}

static const luaL_Reg tmpl_funcs[] = {
    {"render", l_render},
    {"compile", l_compile},
    {"lua_source", l_lua_source},
    {NULL, NULL}
};

/*
** Open the module `tmpl` (require("tmpl")). Creates the compile cache in the registry.
*/
int luaopen_tmpl(lua_State *L)
{
    if (luaL_newmetatable(L, TMPL_OUT_META)) {
        lua_pushcfunction(L, out_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, TMPL_CACHE_KEY);
    luaL_newlib(L, tmpl_funcs);
    return 1;
}
