/*
** tokenizer.c: byte-level BPE from a Hugging Face tokenizer.json (GPT-2, Llama 3 and the like),
** behind tools/tokenizer.h. JSON is read with jansson, the pre-tokenizer patterns run on PCRE2
** (JIT, UTF + Unicode properties). Not a general tokenizers port: no normalizers, no Unigram or
** WordPiece models; what is not supported is refused at load time, naming the part.
** Text format and rules we follow: docs/tokenizer.md.
*/
#define _POSIX_C_SOURCE 200809L
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* GPT-2's pre-tokenizer pattern: what a ByteLevel pre-tokenizer with use_regex splits by. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* The added tokens that end / begin a document, first found wins. */
static const char *const EOD_NAMES[] = { "<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>" };
static const char *const BOD_NAMES[] = { "<|begin_of_text|>", "<s>", "<bos>" };

enum {
    MAX_STAGES = 8,             /* pre-tokenizer steps that split (a Sequence's) */
    CACHE_SLOTS = 1 << 14,      /* per-thread BPE cache: pieces seen recently, direct mapped */
    CACHE_MAX_PIECE = 128,      /* longer pieces are not cached */
    HEAP_FROM = 48,             /* pieces of at least this many bytes merge through a heap */
    JIT_STACK_MAX = 1 << 20     /* PCRE2 JIT stack per thread */
};

typedef struct {
    pcre2_code *re;             /* NULL: a ByteLevel step without regex */
    int prefix_space;           /* ByteLevel add_prefix_space: ' ' before each piece */
} tok_stage;

typedef struct {
    char *text;                 /* as written (raw bytes, no byte-level mapping) */
    size_t len;
    int32_t id;
    int lstrip, rstrip;         /* swallow whitespace on that side */
} tok_added;

typedef struct { uint64_t key; int32_t rank, id; } tok_merge;   /* key: left << 32 | right */

struct tok_model {
    char *path;
    int nid;                    /* ids: largest + 1 */
    const char **bytes;         /* (nid) each id's bytes; NULL for unused ids */
    uint32_t *blen;             /* (nid) */
    char *arena;                /* the bytes of every id */
    int32_t *vslot;             /* string -> id table of vmask + 1 slots (-1: empty) */
    size_t vmask;
    tok_merge *merges;          /* pair -> rank, merged id; mmask + 1 slots (rank -1: empty) */
    size_t mmask;
    int32_t byte_id[256];       /* the id of each one-byte token */
    int ignore_merges;          /* a piece in the vocabulary is one token as is (Llama 3) */
    tok_added *added;           /* (nadded) longest first */
    int nadded;
    unsigned char added_first[256];   /* whether an added token starts with this byte */
    tok_stage stage[MAX_STAGES];
    int nstage;
    int eod, bod;
    pthread_key_t key;          /* each thread's tok_thread */
};

/* -- Errors ------------------------------------------------------------------------------------ */

typedef struct { char *err; size_t cap; const char *path; } tok_err;

static void report(tok_err *e, const char *fmt, ...)
{
    if (!e->cap) return;
    int n = snprintf(e->err, e->cap, "%s: error: ", e->path);
    if (n < 0 || (size_t)n >= e->cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err + n, e->cap - (size_t)n, fmt, ap);
    va_end(ap);
}

/* -- Hashing ----------------------------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static size_t hash_pair(uint64_t key) { return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20); }

static size_t pow2_above(size_t n)
{
    size_t p = 16;
    while (p < 2 * n) p <<= 1;
    return p;
}

/* The id of the bytes s[0..n) in the vocabulary, or -1. */
static int32_t vocab_find(const tok_model *t, const char *s, size_t n)
{
    for (size_t i = hash_bytes(s, n) & t->vmask;; i = (i + 1) & t->vmask) {
        int32_t id = t->vslot[i];
        if (id < 0) return -1;
        if (t->blen[id] == n && !memcmp(t->bytes[id], s, n)) return id;
    }
}

static const tok_merge *merge_find(const tok_model *t, int32_t a, int32_t b)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = hash_pair(key) & t->mmask;; i = (i + 1) & t->mmask) {
        const tok_merge *m = &t->merges[i];
        if (m->rank < 0) return NULL;
        if (m->key == key) return m;
    }
}

/* -- Byte-level alphabet ----------------------------------------------------------------------- */

/* GPT-2's byte-to-character map: printable Latin-1 bytes stand for themselves, the others for
** U+0100 onwards in byte order. byte_char[b] is b's code point; char_byte inverts it. */
static void byte_alphabet(int byte_char[256], int char_byte[324])
{
    int next = 256;
    for (int c = 0; c < 324; c++) char_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        byte_char[b] = printable ? b : next++;
        char_byte[byte_char[b]] = b;
    }
}

/* Decode s (byte-level characters, UTF-8) into raw bytes at out (room for strlen(s)); the
** number of bytes, or -1 when s holds a character outside the alphabet. */
static long unmap_bytes(const char *s, size_t n, const int char_byte[324], char *out)
{
    long k = 0;
    for (size_t i = 0; i < n;) {
        unsigned c = (unsigned char)s[i];
        int cp;
        if (c < 0x80) cp = (int)c, i += 1;
        else if ((c & 0xe0) == 0xc0 && i + 1 < n) {
            cp = (int)((c & 0x1f) << 6 | ((unsigned char)s[i + 1] & 0x3f));
            i += 2;
        } else return -1;
        if (cp >= 324 || char_byte[cp] < 0) return -1;
        out[k++] = (char)char_byte[cp];
    }
    return k;
}

/* -- Loading ----------------------------------------------------------------------------------- */

static const char *type_of(json_t *o)
{
    json_t *ty = json_object_get(o, "type");
    return json_is_string(ty) ? json_string_value(ty) : NULL;
}

static int is_null_or_missing(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return !v || json_is_null(v);
}

static int compile_stage(tok_model *t, tok_err *e, const char *pattern, uint32_t extra,
                         int prefix_space, const char *what)
{
    if (t->nstage == MAX_STAGES) {
        report(e, "pre_tokenizer: more than %d steps", MAX_STAGES);
        return -1;
    }
    tok_stage *st = &t->stage[t->nstage++];
    st->prefix_space = prefix_space;
    if (!pattern) return 0;
    int code;
    PCRE2_SIZE off;
    st->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                           PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | extra, &code, &off, NULL);
    if (!st->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        report(e, "%s: pattern '%s' at offset %zu: %s", what, pattern, (size_t)off, (char *)msg);
        return -1;
    }
    pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE);   /* without JIT it still works, slower */
    return 0;
}

/* One pre-tokenizer (or the steps of a Sequence); *bytelevel set when a ByteLevel step is seen. */
static int load_pretok(tok_model *t, tok_err *e, json_t *p, int *bytelevel)
{
    const char *ty = type_of(p);
    if (!ty) {
        report(e, "pre_tokenizer: no \"type\"");
        return -1;
    }
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(p, "pretokenizers"), *v;
        size_t i;
        if (!json_is_array(list)) {
            report(e, "pre_tokenizer: Sequence without a \"pretokenizers\" list");
            return -1;
        }
        json_array_foreach(list, i, v)
            if (load_pretok(t, e, v, bytelevel)) return -1;
        return 0;
    }
    if (!strcmp(ty, "ByteLevel")) {
        json_t *rx = json_object_get(p, "use_regex");
        int use_regex = !rx || json_is_true(rx);   /* true when absent, as in tokenizers */
        int prefix = json_is_true(json_object_get(p, "add_prefix_space"));
        *bytelevel = 1;
        if (!use_regex && !prefix) return 0;
        return compile_stage(t, e, use_regex ? GPT2_PATTERN : NULL, 0, prefix,
                             "pre_tokenizer ByteLevel");
    }
    if (!strcmp(ty, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        const char *behavior = json_string_value(json_object_get(p, "behavior"));
        json_t *rx = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
        if (!json_is_string(rx) && !json_is_string(str)) {
            report(e, "pre_tokenizer Split: \"pattern\" is neither {\"Regex\": ...} nor "
                   "{\"String\": ...}");
            return -1;
        }
        if (!behavior || strcmp(behavior, "Isolated")) {
            report(e, "pre_tokenizer Split: behavior '%s' is not supported (Isolated only)",
                   behavior ? behavior : "(none)");
            return -1;
        }
        if (json_is_true(json_object_get(p, "invert"))) {
            report(e, "pre_tokenizer Split: invert is not supported");
            return -1;
        }
        return compile_stage(t, e, json_string_value(rx ? rx : str), rx ? 0 : PCRE2_LITERAL, 0,
                             "pre_tokenizer Split");
    }
    report(e, "pre_tokenizer '%s' is not supported (ByteLevel, Split and Sequence only)", ty);
    return -1;
}

/* The merges list: "a b" strings or [a, b] pairs, ranked by position. */
static int load_merges(tok_model *t, tok_err *e, json_t *list, const int char_byte[324])
{
    size_t n = json_array_size(list), i;
    json_t *m;
    t->mmask = pow2_above(n) - 1;
    t->merges = malloc((t->mmask + 1) * sizeof *t->merges);
    char *buf = NULL;
    size_t bufcap = 0;
    if (!t->merges) goto oom;
    for (size_t k = 0; k <= t->mmask; k++) t->merges[k].rank = -1;
    json_array_foreach(list, i, m) {
        const char *a, *b;
        size_t na, nb;
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp = strchr(a + (*a == ' '), ' ');   /* tokenizers splits at one space */
            if (!sp) goto bad;
            na = (size_t)(sp - a);
            b = sp + 1;
            nb = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            na = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            nb = json_string_length(json_array_get(m, 1));
        } else goto bad;
        if (na + nb > bufcap) {
            bufcap = 2 * (na + nb) + 64;
            char *nbuf = realloc(buf, bufcap);
            if (!nbuf) goto oom;
            buf = nbuf;
        }
        long la = unmap_bytes(a, na, char_byte, buf), lb;
        lb = la < 0 ? -1 : unmap_bytes(b, nb, char_byte, buf + la);
        int32_t ia = la < 0 ? -1 : vocab_find(t, buf, (size_t)la);
        int32_t ib = lb < 0 ? -1 : vocab_find(t, buf + la, (size_t)lb);
        int32_t im = lb < 0 ? -1 : vocab_find(t, buf, (size_t)(la + lb));
        if (ia < 0 || ib < 0 || im < 0) {
            report(e, "model.merges[%zu] (\"%.*s\" + \"%.*s\"): %s", i, (int)na, a, (int)nb, b,
                   la < 0 || lb < 0 ? "not byte-level characters" :
                   "a part or the merged token is not in model.vocab");
            free(buf);
            return -1;
        }
        uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        size_t s = hash_pair(key) & t->mmask;
        while (t->merges[s].rank >= 0 && t->merges[s].key != key) s = (s + 1) & t->mmask;
        if (t->merges[s].rank < 0)   /* a repeated merge keeps its first rank */
            t->merges[s] = (tok_merge){ key, (int32_t)i, im };
    }
    free(buf);
    return 0;
bad:
    report(e, "model.merges[%zu]: neither \"a b\" nor [\"a\", \"b\"]", i);
    free(buf);
    return -1;
oom:
    report(e, "out of memory");
    free(buf);
    return -1;
}

/* Set id's bytes (copied into the arena at *used). */
static void set_bytes(tok_model *t, int32_t id, const char *s, size_t n, size_t *used)
{
    memcpy(t->arena + *used, s, n);
    t->bytes[id] = t->arena + *used;
    t->blen[id] = (uint32_t)n;
    *used += n;
}

static int by_length_desc(const void *a, const void *b)
{
    const tok_added *x = a, *y = b;
    return (x->len < y->len) - (x->len > y->len);
}

static int load_json(tok_model *t, tok_err *e, json_t *root)
{
    if (!json_is_object(root)) {
        report(e, "not a tokenizer.json (the top level is not an object)");
        return -1;
    }
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) {
        report(e, "no \"model\" object: not a Hugging Face tokenizer.json");
        return -1;
    }
    const char *mtype = type_of(model);
    if (mtype && strcmp(mtype, "BPE")) {
        report(e, "model type '%s' is not supported (byte-level BPE only)", mtype);
        return -1;
    }
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        report(e, "model: no \"vocab\" object or \"merges\" list (byte-level BPE has both)");
        return -1;
    }
    json_t *pre = json_object_get(root, "pre_tokenizer");
    if (!is_null_or_missing(root, "normalizer")) {
        report(e, "normalizer '%s' is not supported (byte-level BPE without a normalizer only)",
               type_of(json_object_get(root, "normalizer")) ?: "?");
        return -1;
    }
    json_t *dec = json_object_get(root, "decoder");
    if (dec && !json_is_null(dec) && (!type_of(dec) || strcmp(type_of(dec), "ByteLevel"))) {
        report(e, "decoder '%s' is not supported (ByteLevel only)", type_of(dec) ?: "?");
        return -1;
    }
    json_t *dropout = json_object_get(model, "dropout");
    if (json_is_true(json_object_get(model, "byte_fallback")) ||
        (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0)) {
        report(e, "model: byte_fallback and dropout are not supported (byte-level BPE only)");
        return -1;
    }
    const char *affix[] = { "continuing_subword_prefix", "end_of_word_suffix" };
    for (int k = 0; k < 2; k++) {
        const char *v = json_string_value(json_object_get(model, affix[k]));
        if (v && *v) {
            report(e, "model: %s '%s' is not supported (byte-level BPE only)", affix[k], v);
            return -1;
        }
    }
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    if (!pre || json_is_null(pre)) {
        report(e, "no pre_tokenizer: not a byte-level BPE tokenizer (ByteLevel expected)");
        return -1;
    }
    int bytelevel = 0;
    if (load_pretok(t, e, pre, &bytelevel)) return -1;
    if (!bytelevel) {
        report(e, "pre_tokenizer has no ByteLevel step: not a byte-level BPE tokenizer");
        return -1;
    }

    /* ids: the vocabulary's and the added tokens' */
    json_t *added = json_object_get(root, "added_tokens"), *v;
    const char *k;
    size_t i, total = 0;
    int32_t maxid = -1;
    json_object_foreach(vocab, k, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= INT32_MAX / 2) {
            report(e, "model.vocab[\"%s\"]: the id is not an integer in [0, 2^30)", k);
            return -1;
        }
        if (id > maxid) maxid = (int32_t)id;
        total += strlen(k);
    }
    json_array_foreach(added, i, v) {
        json_t *id = json_object_get(v, "id"), *c = json_object_get(v, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX / 2 || !json_is_string(c) ||
            !json_string_length(c)) {
            report(e, "added_tokens[%zu]: needs an \"id\" in [0, 2^30) and a non-empty "
                   "\"content\"", i);
            return -1;
        }
        if (json_is_true(json_object_get(v, "single_word"))) {
            report(e, "added_tokens[%zu] ('%s'): single_word is not supported", i,
                   json_string_value(c));
            return -1;
        }
        if (json_integer_value(id) > maxid) maxid = (int32_t)json_integer_value(id);
        total += json_string_length(c);
    }
    t->nid = maxid + 1;
    t->bytes = calloc((size_t)t->nid, sizeof *t->bytes);
    t->blen = calloc((size_t)t->nid, sizeof *t->blen);
    t->arena = malloc(total + 1);
    t->vmask = pow2_above((size_t)t->nid) - 1;
    t->vslot = malloc((t->vmask + 1) * sizeof *t->vslot);
    t->nadded = (int)json_array_size(added);
    t->added = calloc((size_t)t->nadded + 1, sizeof *t->added);
    if (!t->bytes || !t->blen || !t->arena || !t->vslot || !t->added) {
        report(e, "out of memory");
        return -1;
    }
    memset(t->vslot, -1, (t->vmask + 1) * sizeof *t->vslot);
    int byte_char[256], char_byte[324];
    byte_alphabet(byte_char, char_byte);
    size_t used = 0;
    json_object_foreach(vocab, k, v) {
        int32_t id = (int32_t)json_integer_value(v);
        long n = unmap_bytes(k, strlen(k), char_byte, t->arena + used);
        if (n < 0) {
            report(e, "model.vocab[\"%s\"]: not byte-level characters (a byte-level BPE "
                   "vocabulary spells bytes with GPT-2's alphabet)", k);
            return -1;
        }
        if (t->bytes[id]) {
            report(e, "model.vocab[\"%s\"]: id %d given twice", k, id);
            return -1;
        }
        set_bytes(t, id, t->arena + used, (size_t)n, &used);
        size_t s = hash_bytes(t->bytes[id], (size_t)n) & t->vmask;
        while (t->vslot[s] >= 0) {
            int32_t o = t->vslot[s];
            if (t->blen[o] == (size_t)n && !memcmp(t->bytes[o], t->bytes[id], (size_t)n)) break;
            s = (s + 1) & t->vmask;
        }
        if (t->vslot[s] < 0) t->vslot[s] = id;
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        if ((t->byte_id[b] = vocab_find(t, &c, 1)) < 0) {
            report(e, "model.vocab: no token for byte 0x%02x (a byte-level vocabulary has all "
                   "256)", b);
            return -1;
        }
    }
    json_array_foreach(added, i, v) {
        tok_added *a = &t->added[i];
        json_t *c = json_object_get(v, "content");
        a->id = (int32_t)json_integer_value(json_object_get(v, "id"));
        a->len = json_string_length(c);
        a->lstrip = json_is_true(json_object_get(v, "lstrip"));
        a->rstrip = json_is_true(json_object_get(v, "rstrip"));
        if (!t->bytes[a->id]) set_bytes(t, a->id, json_string_value(c), a->len, &used);
        a->text = (char *)t->bytes[a->id];
        if (t->blen[a->id] != a->len || memcmp(a->text, json_string_value(c), a->len)) {
            /* an added token over a vocabulary id with other bytes: match its content */
            a->text = strdup(json_string_value(c));
            if (!a->text) {
                report(e, "out of memory");
                return -1;
            }
        }
        t->added_first[(unsigned char)a->text[0]] = 1;
    }
    qsort(t->added, (size_t)t->nadded, sizeof *t->added, by_length_desc);
    if (load_merges(t, e, merges, char_byte)) return -1;
    t->eod = t->bod = -1;
    for (size_t n = 0; n < sizeof EOD_NAMES / sizeof *EOD_NAMES && t->eod < 0; n++)
        t->eod = tok_id_of(t, EOD_NAMES[n]);
    for (size_t n = 0; n < sizeof BOD_NAMES / sizeof *BOD_NAMES && t->bod < 0; n++)
        t->bod = tok_id_of(t, BOD_NAMES[n]);
    return 0;
}

typedef struct tok_thread tok_thread;
static void thread_free(void *p);

/*
** Load PATH (tokenizer.json, or a directory holding one). NULL on failure with
** "FILE: error: what" in err.
*/
tok_model *tok_load(const char *path, char *err, size_t errcap)
{
    struct stat st;
    char *file;
    if (!stat(path, &st) && S_ISDIR(st.st_mode)) {
        size_t n = strlen(path) + sizeof "/tokenizer.json";
        file = malloc(n);
        if (file) snprintf(file, n, "%s%stokenizer.json", path,
                           path[strlen(path) - 1] == '/' ? "" : "/");
    } else file = strdup(path);
    tok_err e = { err, errcap, file ? file : path };
    if (!file) {
        report(&e, "out of memory");
        return NULL;
    }
    json_error_t je;
    FILE *f = fopen(file, "rb");
    if (!f) {
        report(&e, "cannot read: %s (a Hugging Face tokenizer.json, or a directory holding "
               "one, expected)", strerror(errno));
        free(file);
        return NULL;
    }
    /* whole, then parsed from memory (jansson reads a FILE a character at a time) */
    char *text = NULL;
    size_t len = 0, cap = 0;
    int oom = 0;
    while (!feof(f) && !ferror(f)) {
        if (len == cap) {
            char *p = realloc(text, cap = cap ? 2 * cap : 1 << 20);
            if (!p) {
                oom = 1;
                break;
            }
            text = p;
        }
        len += fread(text + len, 1, cap - len, f);
    }
    if (oom || ferror(f)) {
        report(&e, oom ? "out of memory" : "cannot read: %s", strerror(errno));
        fclose(f);
        free(text);
        free(file);
        return NULL;
    }
    fclose(f);
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) {
        snprintf(err, errcap, "%s:%d:%d: error: %s (not a JSON file: a tokenizer.json "
                 "expected)", file, je.line, je.column, je.text);
        free(file);
        return NULL;
    }
    tok_model *t = calloc(1, sizeof *t);
    if (!t || pthread_key_create(&t->key, thread_free)) {
        report(&e, "out of memory");
        free(t);
        json_decref(root);
        free(file);
        return NULL;
    }
    t->path = file;
    int rc = load_json(t, &e, root);
    json_decref(root);
    if (rc) {
        tok_free(t);
        return NULL;
    }
    return t;
}

/* Free t; the caller's own per-thread state too (other threads' is freed when they exit). */
void tok_free(tok_model *t)
{
    if (!t) return;
    thread_free(pthread_getspecific(t->key));
    pthread_key_delete(t->key);
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].text != t->bytes[t->added[i].id]) free(t->added[i].text);
    for (int i = 0; i < t->nstage; i++) pcre2_code_free(t->stage[i].re);
    free(t->added);
    free(t->merges);
    free(t->vslot);
    free(t->arena);
    free(t->blen);
    free(t->bytes);
    free(t->path);
    free(t);
}

int tok_vocab_size(const tok_model *t) { return t->nid; }
int tok_eod_id(const tok_model *t) { return t->eod; }
int tok_bod_id(const tok_model *t) { return t->bod; }

/* The id of token s: an added token's content, else a vocabulary entry's bytes; -1 if none. */
int tok_id_of(const tok_model *t, const char *s)
{
    size_t n = strlen(s);
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].text, s, n)) return t->added[i].id;
    return n ? vocab_find(t, s, n) : -1;
}

/* The bytes of id (raw bytes: byte-level characters mapped back; an added token: its text),
** owned by t; NULL for an id outside the vocabulary. */
const char *tok_bytes(const tok_model *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->nid || !t->bytes[id]) return NULL;
    *len = t->blen[id];
    return t->bytes[id];
}

/* -- Per-thread state: BPE cache, PCRE2 match data --------------------------------------------- */

typedef struct {
    uint64_t hash;
    uint16_t len, nids;         /* piece bytes, ids */
    char *piece;                /* len bytes, then nids int32 ids (aligned copy) */
} tok_slot;

struct tok_thread {
    tok_slot slot[CACHE_SLOTS];
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    int32_t *work;              /* BPE scratch: ids, ranks, links, heap */
    size_t workcap;             /* int32s */
    char *buf;                  /* text with U+FFFD for invalid UTF-8, pieces with a prefix */
    size_t bufcap;
};

static void thread_free(void *p)
{
    tok_thread *th = p;
    if (!th) return;
    for (int i = 0; i < CACHE_SLOTS; i++) free(th->slot[i].piece);
    pcre2_match_data_free(th->md);
    pcre2_match_context_free(th->mc);
    pcre2_jit_stack_free(th->js);
    free(th->work);
    free(th->buf);
    free(th);
}

static tok_thread *thread_state(const tok_model *t)
{
    tok_thread *th = pthread_getspecific(t->key);
    if (th) return th;
    th = calloc(1, sizeof *th);
    if (!th) return NULL;
    th->md = pcre2_match_data_create(1, NULL);
    th->mc = pcre2_match_context_create(NULL);
    th->js = pcre2_jit_stack_create(32 << 10, JIT_STACK_MAX, NULL);
    if (!th->md || !th->mc || !th->js || pthread_setspecific(t->key, th)) {
        thread_free(th);
        return NULL;
    }
    pcre2_jit_stack_assign(th->mc, NULL, th->js);
    return th;
}

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * size);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* -- Encoding ---------------------------------------------------------------------------------- */

typedef struct {
    const tok_model *t;
    tok_thread *th;
    int32_t **ids;
    size_t *n, *cap;
} tok_out;

static int emit(tok_out *o, const int32_t *ids, size_t k)
{
    if (grow((void **)o->ids, o->cap, *o->n + k, sizeof **o->ids)) return -1;
    memcpy(*o->ids + *o->n, ids, k * sizeof *ids);
    *o->n += k;
    return 0;
}

/* Merge ids[0..n) in place, lowest rank first (leftmost among equals); the count left.
** Small pieces: a scan per merge. Long ones: a heap of (rank, position) over a linked list. */
static size_t bpe_merge(const tok_model *t, int32_t *id, size_t n, int32_t *scratch)
{
    if (n < HEAP_FROM) {
        int32_t *rank = scratch;
        for (size_t i = 0; i + 1 < n; i++) {
            const tok_merge *m = merge_find(t, id[i], id[i + 1]);
            rank[i] = m ? m->rank : INT32_MAX;
        }
        while (n > 1) {
            size_t best = 0;
            for (size_t i = 1; i + 1 < n; i++)
                if (rank[i] < rank[best]) best = i;
            if (rank[best] == INT32_MAX) break;
            id[best] = merge_find(t, id[best], id[best + 1])->id;
            memmove(id + best + 1, id + best + 2, (n - best - 2) * sizeof *id);
            memmove(rank + best + 1, rank + best + 2,
                    (n > best + 2 ? n - best - 3 : 0) * sizeof *rank);
            n--;
            if (best + 1 < n) {
                const tok_merge *m = merge_find(t, id[best], id[best + 1]);
                rank[best] = m ? m->rank : INT32_MAX;
            }
            if (best > 0) {
                const tok_merge *m = merge_find(t, id[best - 1], id[best]);
                rank[best - 1] = m ? m->rank : INT32_MAX;
            }
        }
        return n;
    }
    /* scratch: next (n), prev (n), rank of pair at i (n), heap entries (2 per pair, n each) */
    int32_t *next = scratch, *prev = scratch + n, *rank = scratch + 2 * n;
    int64_t *heap = (int64_t *)(scratch + 3 * n + (n & 1));
    size_t hn = 0;
#define HKEY(r, i) ((int64_t)(r) << 32 | (int64_t)(i))
#define HPUSH(v) do { size_t c_ = hn++; heap[c_] = (v); \
        while (c_ && heap[(c_ - 1) / 2] > heap[c_]) { \
            int64_t t_ = heap[c_]; heap[c_] = heap[(c_ - 1) / 2]; heap[(c_ - 1) / 2] = t_; \
            c_ = (c_ - 1) / 2; } } while (0)
    for (size_t i = 0; i < n; i++) {
        next[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prev[i] = (int32_t)i - 1;
        const tok_merge *m = i + 1 < n ? merge_find(t, id[i], id[i + 1]) : NULL;
        rank[i] = m ? m->rank : INT32_MAX;
        if (m) HPUSH(HKEY(m->rank, i));
    }
    while (hn) {
        int64_t top = heap[0];
        heap[0] = heap[--hn];
        for (size_t c = 0;;) {   /* sift down */
            size_t l = 2 * c + 1, r = l + 1, s = c;
            if (l < hn && heap[l] < heap[s]) s = l;
            if (r < hn && heap[r] < heap[s]) s = r;
            if (s == c) break;
            int64_t tmp = heap[c];
            heap[c] = heap[s];
            heap[s] = tmp;
            c = s;
        }
        int32_t r = (int32_t)(top >> 32), i = (int32_t)(top & 0xffffffff);
        if (rank[i] != r || id[i] < 0) continue;   /* stale: the pair changed since */
        int32_t j = next[i];
        id[i] = merge_find(t, id[i], id[j])->id;
        id[j] = -1;
        next[i] = next[j];
        if (next[j] >= 0) prev[next[j]] = i;
        rank[j] = INT32_MAX;
        const tok_merge *m = next[i] >= 0 ? merge_find(t, id[i], id[next[i]]) : NULL;
        rank[i] = m ? m->rank : INT32_MAX;
        if (m) HPUSH(HKEY(m->rank, i));
        if (prev[i] >= 0) {
            int32_t p = prev[i];
            m = merge_find(t, id[p], id[i]);
            rank[p] = m ? m->rank : INT32_MAX;
            if (m) HPUSH(HKEY(m->rank, p));
        }
    }
#undef HPUSH
#undef HKEY
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) id[k++] = id[i];
    return k;
}

/* The ids of one pre-tokenized piece. */
static int encode_piece(tok_out *o, const char *s, size_t n)
{
    const tok_model *t = o->t;
    if (!n) return 0;
    tok_thread *th = o->th;
    uint64_t h = 0;
    tok_slot *sl = NULL;
    if (n <= CACHE_MAX_PIECE) {
        h = hash_bytes(s, n);
        sl = &th->slot[h & (CACHE_SLOTS - 1)];
        if (sl->piece && sl->hash == h && sl->len == n && !memcmp(sl->piece, s, n)) {
            int32_t ids[CACHE_MAX_PIECE];
            memcpy(ids, sl->piece + n, sl->nids * sizeof *ids);
            return emit(o, ids, sl->nids);
        }
    }
    if (grow((void **)&th->work, &th->workcap, 12 * n + 16, sizeof *th->work)) return -1;
    int32_t *id = th->work;
    size_t k = 1;
    if (!t->ignore_merges || (id[0] = vocab_find(t, s, n)) < 0) {
        for (size_t i = 0; i < n; i++) id[i] = t->byte_id[(unsigned char)s[i]];
        k = bpe_merge(t, id, n, th->work + n + (n & 1));
    }
    if (sl) {
        char *p = malloc(n + k * sizeof *id);
        if (p) {
            free(sl->piece);
            memcpy(p, s, n);
            memcpy(p + n, id, k * sizeof *id);
            *sl = (tok_slot){ h, (uint16_t)n, (uint16_t)k, p };
        }
    }
    return emit(o, id, k);
}

/* Split s[0..n) by pre-tokenizer stage k on (matches and the text between them are pieces,
** as the Isolated behaviour has it); pieces past the last stage are encoded. */
static int split(tok_out *o, int k, const char *s, size_t n)
{
    const tok_model *t = o->t;
    if (k == t->nstage) return encode_piece(o, s, n);
    const tok_stage *st = &t->stage[k];
    if (st->prefix_space && n && *s != ' ') {
        char *p = malloc(n + 1);
        if (!p) return -1;
        p[0] = ' ';
        memcpy(p + 1, s, n);
        int rc = split(o, k + !st->re, p, n + 1);   /* with a regex: this stage again */
        free(p);
        return rc;
    }
    if (!st->re) return split(o, k + 1, s, n);
    size_t at = 0;
    while (at < n) {
        int rc = pcre2_jit_match(st->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, o->th->md,
                                 o->th->mc);
        if (rc == PCRE2_ERROR_JIT_BADOPTION)   /* no JIT on this machine */
            rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, o->th->md,
                             o->th->mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return -1;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(o->th->md);
        size_t b = ov[0], e = ov[1];
        if (e == b) {   /* an empty match splits nothing: look on from the next character */
            size_t c = b + 1;
            while (c < n && ((unsigned char)s[c] & 0xc0) == 0x80) c++;
            if (c >= n) break;
            if (split(o, k + 1, s + at, c - at)) return -1;
            at = c;
            continue;
        }
        if (b > at && split(o, k + 1, s + at, b - at)) return -1;
        if (split(o, k + 1, s + b, e - b)) return -1;
        at = e;
    }
    return at < n ? split(o, k + 1, s + at, n - at) : 0;
}

/* The longest added token at s[0..n), or NULL. */
static const tok_added *added_at(const tok_model *t, const char *s, size_t n)
{
    if (!t->added_first[(unsigned char)*s]) return NULL;
    for (int i = 0; i < t->nadded; i++) {   /* longest first */
        const tok_added *a = &t->added[i];
        if (a->len <= n && !memcmp(a->text, s, a->len)) return a;
    }
    return NULL;
}

static int is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Encode valid UTF-8 s[0..n): added tokens first (leftmost, longest), pre-tokenizer between. */
static int encode_valid(tok_out *o, const char *s, size_t n)
{
    const tok_model *t = o->t;
    size_t from = 0;
    for (size_t i = 0; i < n; i++) {
        const tok_added *a = added_at(t, s + i, n - i);
        if (!a) continue;
        size_t end = i;
        if (a->lstrip) while (end > from && is_space(s[end - 1])) end--;
        if (end > from && split(o, 0, s + from, end - from)) return -1;
        if (emit(o, &a->id, 1)) return -1;
        i += a->len;
        if (a->rstrip) while (i < n && is_space(s[i])) i++;
        from = i;
        i--;
    }
    return from < n ? split(o, 0, s + from, n - from) : 0;
}

/* The length of the valid UTF-8 sequence at s[0..n), or 0 (WHATWG's decoder: the longest
** prefix of a valid sequence is what one U+FFFD replaces). *bad set to that prefix's length. */
static size_t utf8_at(const unsigned char *s, size_t n, size_t *bad)
{
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xbf;
    *bad = 1;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) need = 1;
    else if (c >= 0xe0 && c <= 0xef) {
        need = 2;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else return 0;
    for (size_t k = 1; k <= need; k++) {
        if (k >= n || s[k] < lo || s[k] > hi) return 0;
        *bad = k + 1;
        lo = 0x80, hi = 0xbf;
    }
    return need + 1;
}

/*
** Append the ids of text[0..len) to *ids. Invalid UTF-8 is read as a UTF-8 decoder that
** replaces errors reads it (each maximal invalid subsequence becomes U+FFFD). 0, or -1 when
** out of memory.
*/
int tok_encode(const tok_model *t, const char *text, size_t len,
               int32_t **ids, size_t *n, size_t *cap)
{
    tok_thread *th = thread_state(t);
    if (!th) return -1;
    tok_out o = { t, th, ids, n, cap };
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, bad;
    while (i < len) {   /* fast path: ASCII runs */
        if (s[i] < 0x80) i++;
        else {
            size_t k = utf8_at(s + i, len - i, &bad);
            if (!k) break;
            i += k;
        }
    }
    if (i == len) return encode_valid(&o, text, len);
    /* at least one invalid sequence: a cleaned copy (3 bytes of U+FFFD per bad byte at most) */
    if (grow((void **)&th->buf, &th->bufcap, 3 * len, 1)) return -1;
    memcpy(th->buf, text, i);
    size_t k = i;
    while (i < len) {
        size_t v = utf8_at(s + i, len - i, &bad);
        if (v) {
            memcpy(th->buf + k, s + i, v);
            k += v, i += v;
        } else {
            memcpy(th->buf + k, "\xef\xbf\xbd", 3);
            k += 3, i += bad;
        }
    }
    return encode_valid(&o, th->buf, k);
}
