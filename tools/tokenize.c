/*
** tokenize: turn text into token ids for the training programs, and ids back into text.
** With --tokenizer (a Hugging Face tokenizer.json: byte-level BPE, tools/tokenizer.h) real
** tokens; without, one token per byte (vocabulary 256, what the demo corpus and the tiny models
** use). Inputs: text files (one document each) or JSONL (--json-keys, a document per line, as
** Megatron's preprocess_data.py). Outputs: a Megatron indexed dataset (--output-prefix), a
** nanoGPT .bin or an llm.c shard (-o), or ids on stdout (--print). --decode turns ids into text.
** Formats: docs/tokenizer.md. Every file is written whole or not at all (FILE.tmp, renamed).
*/
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tokenizer.h"   // defines: tok_load, tok_encode, tok_bytes, tok_eod_id

#define LLMC_MAGIC   20240520
#define LLMC_VERSION 1
#define LLMC_HEADER_INTS 256

enum {
    MAX_KEYS = 16,                  /* --json-keys */
    MAX_TMP = 2 * MAX_KEYS + 1,     /* files being written */
    BATCH_BYTES = 4 << 20,          /* text read per worker per batch */
    BATCH_DOCS = 4096,              /* documents per worker per batch, at most */
    MAX_WORKERS = 256,
    NANOGPT_VOCAB = 65536,          /* uint16 ids */
    MEGATRON_UINT16_BELOW = 65500   /* Megatron's DType.optimal_dtype: uint16 below, else int32 */
};

/* Megatron's dtype codes (indexed_dataset.py's DType) for the ones we write and read. */
enum { MM_UINT8 = 1, MM_INT8 = 2, MM_INT16 = 3, MM_INT32 = 4, MM_INT64 = 5, MM_UINT16 = 8 };
static const char MM_MAGIC[9] = "MMIDIDX\0";
enum { MM_VERSION = 1, MM_HEADER = 9 + 8 + 1 + 8 + 8 };

static const char *progname = "tokenize";

/* -- Errors and the files being written -------------------------------------------------------- */

static char *tmp_paths[MAX_TMP];   /* removed when we die, so nothing half-written remains */
static volatile sig_atomic_t ntmp;

static void remove_tmps(void)
{
    for (int i = 0; i < ntmp; i++)
        if (tmp_paths[i]) unlink(tmp_paths[i]);
}

static void on_signal(int sig)
{
    remove_tmps();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void die(const char *fmt, ...)
{
    va_list ap;
    remove_tmps();
    fprintf(stderr, "%s: error: ", progname);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p) die("out of memory");
    return p;
}

static char *xstrcat3(const char *a, const char *b, const char *c)
{
    size_t n = strlen(a) + strlen(b) + strlen(c) + 1;
    char *s = xrealloc(NULL, n);
    snprintf(s, n, "%s%s%s", a, b, c);
    return s;
}

/* An output file: written to PATH.tmp, renamed to PATH by out_commit. */
typedef struct { char *path, *tmp; FILE *f; int slot; } out_file;

static void out_open(out_file *o, char *path)
{
    o->path = path;
    o->tmp = xstrcat3(path, ".tmp", "");
    o->slot = ntmp;
    tmp_paths[ntmp] = o->tmp;
    o->f = fopen(o->tmp, "wb");
    if (!o->f) die("cannot create '%s': %s", o->tmp, strerror(errno));
    ntmp++;
}

static void out_close(out_file *o)
{
    if (fflush(o->f) || ferror(o->f) || fsync(fileno(o->f)) || fclose(o->f))
        die("cannot write '%s': %s", o->tmp, strerror(errno));
}

static void out_commit(out_file *o)
{
    if (rename(o->tmp, o->path)) die("cannot rename to '%s': %s", o->path, strerror(errno));
    tmp_paths[o->slot] = NULL;
}

static void put_le(FILE *f, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) fputc((int)((v >> (8 * i)) & 0xff), f);
}

/* -- Options --------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: %s [--tokenizer PATH] [--json-keys KEY...] [--append-eod] [--workers N]\n"
        "          (--output-prefix P | -o FILE [--llmc] | --print) [--input] INPUT...\n"
        "       %s [--tokenizer PATH] --decode [DATASET]\n"
        "  Turn INPUT files into token ids: each file one document, or with --json-keys one\n"
        "  document per JSONL line (the string under KEY, as Megatron's preprocess_data.py).\n"
        "  --tokenizer PATH    a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3),\n"
        "                      or a directory holding one; without it one token per byte\n"
        "  --json-keys KEY...  JSONL input; several keys make one dataset each (the keys\n"
        "                      run to the next flag: inputs before, or after --input or --)\n"
        "  --input FILE        an input (as Megatron's flag; also plain words, '-': stdin)\n"
        "  --append-eod        the end-of-document token after each non-empty document\n"
        "  --output-prefix P   Megatron indexed datasets P_KEY_document.bin/.idx (KEY: text\n"
        "                      for text files); uint16 ids below 65,500 ids, else int32\n"
        "  -o FILE             a nanoGPT .bin (uint16 ids, all documents in a row)\n"
        "  --llmc              with -o: an llm.c token shard (1024-byte header) instead\n"
        "  --print             ids on stdout, one line per document\n"
        "  --workers N         encoding threads (default: the CPUs online)\n"
        "  --quiet             no progress or summary on stderr\n"
        "  --decode [DATASET]  print the text of the ids in DATASET (a Megatron prefix or\n"
        "                      .bin/.idx, a nanoGPT .bin, an llm.c shard), or of the\n"
        "                      whitespace-separated ids on stdin\n"
        "  Output files are written to FILE.tmp and renamed when complete.\n",
        progname, progname);
}

typedef struct {
    const char *tokenizer, *prefix, *out;
    const char *keys[MAX_KEYS];
    int nkeys, jsonl, eod, llmc, print, quiet, workers, decode;
    char **inputs;
    int ninputs;
} options;

static void parse_args(options *op, int argc, char **argv)
{
    op->inputs = xrealloc(NULL, (size_t)argc * sizeof *op->inputs);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--tokenizer") && more) op->tokenizer = argv[++i];
        else if (!strcmp(a, "--output-prefix") && more) op->prefix = argv[++i];
        else if (!strcmp(a, "-o") && more) op->out = argv[++i];
        else if (!strcmp(a, "--input") && more) op->inputs[op->ninputs++] = argv[++i];
        else if (!strcmp(a, "--llmc")) op->llmc = 1;
        else if (!strcmp(a, "--print")) op->print = 1;
        else if (!strcmp(a, "--append-eod")) op->eod = 1;
        else if (!strcmp(a, "--quiet")) op->quiet = 1;
        else if (!strcmp(a, "--decode")) op->decode = 1;
        else if (!strcmp(a, "--workers") && more) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > MAX_WORKERS)
                die("--workers '%s': a number of threads from 1 to %d expected", argv[i],
                    MAX_WORKERS);
            op->workers = (int)n;
        } else if (!strcmp(a, "--json-keys") && more) {
            /* the keys: the words up to the next flag, as Megatron's nargs='+' */
            struct stat st;
            op->jsonl = 1;
            while (i + 1 < argc && argv[i + 1][0] != '-') {
                if (op->nkeys == MAX_KEYS) die("--json-keys: at most %d keys", MAX_KEYS);
                if (!stat(argv[i + 1], &st) && S_ISREG(st.st_mode))
                    die("--json-keys: '%s' is a file, not a key: give the inputs before "
                        "--json-keys, after --input or after --", argv[i + 1]);
                op->keys[op->nkeys++] = argv[++i];
            }
            if (!op->nkeys) die("--json-keys: no key given (e.g. --json-keys text)");
        } else if (!strcmp(a, "--")) {
            while (++i < argc) op->inputs[op->ninputs++] = argv[i];
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "%s: error: unknown or incomplete option '%s'\n", progname, a);
            usage(stderr);
            exit(2);
        } else op->inputs[op->ninputs++] = argv[i];
    }
    if (!op->jsonl) op->keys[op->nkeys++] = "text";
}

/* -- Documents and their encoding -------------------------------------------------------------- */

typedef struct {
    char *text;                 /* a file's bytes, or a JSONL line */
    size_t len;
    const char *file;
    long line;                  /* JSONL: 1-based line; 0 for a text file */
    int32_t *ids[MAX_KEYS];     /* the encoding of each key's text */
    size_t nids[MAX_KEYS], cap[MAX_KEYS];
    char *err;                  /* what went wrong, reported in input order */
} doc;

typedef struct {
    const options *op;
    const tok_model *tok;
    int eod;
    doc *docs;
    int ndocs;
    int next;                   /* the next document to take */
    pthread_mutex_t lock;       /* next, round, busy, quit */
    pthread_cond_t start, done;
    long round;                 /* batches started */
    int busy;                   /* workers still on this batch */
    int quit;
    pthread_t threads[MAX_WORKERS];
    int nthreads;               /* workers besides the main thread */
} batch;

static char *fmt_err(const char *fmt, ...)
{
    va_list ap;
    char buf[512];
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return xstrcat3(buf, "", "");
}

static int encode_text(const batch *b, doc *d, int k, const char *s, size_t n)
{
    if (b->tok) {
        if (tok_encode(b->tok, s, n, &d->ids[k], &d->nids[k], &d->cap[k])) return -1;
    } else {
        d->ids[k] = xrealloc(d->ids[k], (n + 1) * sizeof **d->ids);
        for (size_t i = 0; i < n; i++) d->ids[k][i] = (unsigned char)s[i];
        d->nids[k] = n;
        d->cap[k] = n + 1;
    }
    if (b->op->eod && d->nids[k]) {   /* Megatron: an empty document gets no end token */
        if (d->nids[k] == d->cap[k]) {
            d->cap[k] = 2 * d->cap[k] + 1;
            d->ids[k] = xrealloc(d->ids[k], d->cap[k] * sizeof **d->ids);
        }
        d->ids[k][d->nids[k]++] = b->eod;
    }
    return 0;
}

static void encode_doc(const batch *b, doc *d)
{
    const options *op = b->op;
    if (!op->jsonl) {
        if (encode_text(b, d, 0, d->text, d->len)) d->err = fmt_err("%s: out of memory", d->file);
        return;
    }
    json_error_t je;
    json_t *root = json_loadb(d->text, d->len, JSON_ALLOW_NUL, &je);
    if (!json_is_object(root)) {
        d->err = root ? fmt_err("%s:%ld: error: not a JSON object", d->file, d->line)
                      : fmt_err("%s:%ld:%d: error: %s (JSONL: one JSON object per line)",
                                d->file, d->line, je.column, je.text);
        json_decref(root);
        return;
    }
    for (int k = 0; k < op->nkeys && !d->err; k++) {
        json_t *v = json_object_get(root, op->keys[k]);
        if (!v)
            d->err = fmt_err("%s:%ld: error: no key '%s' (--json-keys names the key holding "
                             "each document's text)", d->file, d->line, op->keys[k]);
        else if (!json_is_string(v))
            d->err = fmt_err("%s:%ld: error: '%s' is not a string", d->file, d->line,
                             op->keys[k]);
        else if (encode_text(b, d, k, json_string_value(v), json_string_length(v)))
            d->err = fmt_err("%s:%ld: out of memory", d->file, d->line);
    }
    json_decref(root);
}

/* Take documents of the current batch until none is left. */
static void work(batch *b)
{
    for (;;) {
        pthread_mutex_lock(&b->lock);
        int i = b->next++;
        pthread_mutex_unlock(&b->lock);
        if (i >= b->ndocs) return;
        encode_doc(b, &b->docs[i]);
    }
}

/* A worker thread: lives for the whole run (its tokenizer cache stays warm), takes part in
** each batch the main thread starts. */
static void *worker(void *arg)
{
    batch *b = arg;
    long seen = 0;
    for (;;) {
        pthread_mutex_lock(&b->lock);
        while (b->round == seen && !b->quit) pthread_cond_wait(&b->start, &b->lock);
        if (b->quit) {
            pthread_mutex_unlock(&b->lock);
            return NULL;
        }
        seen = b->round;
        pthread_mutex_unlock(&b->lock);
        work(b);
        pthread_mutex_lock(&b->lock);
        if (--b->busy == 0) pthread_cond_signal(&b->done);
        pthread_mutex_unlock(&b->lock);
    }
}

/* Encode the batch on the main thread and the workers; return when every document is done. */
static void encode_batch(batch *b)
{
    pthread_mutex_lock(&b->lock);
    b->next = 0;
    b->busy = b->nthreads;
    b->round++;
    pthread_cond_broadcast(&b->start);
    pthread_mutex_unlock(&b->lock);
    work(b);
    pthread_mutex_lock(&b->lock);
    while (b->busy) pthread_cond_wait(&b->done, &b->lock);
    pthread_mutex_unlock(&b->lock);
}

static void start_workers(batch *b, int workers)
{
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->start, NULL);
    pthread_cond_init(&b->done, NULL);
    for (int i = 0; i + 1 < workers; i++) {
        if (pthread_create(&b->threads[i], NULL, worker, b)) break;
        b->nthreads++;
    }
}

static void stop_workers(batch *b)
{
    pthread_mutex_lock(&b->lock);
    b->quit = 1;
    pthread_cond_broadcast(&b->start);
    pthread_mutex_unlock(&b->lock);
    for (int i = 0; i < b->nthreads; i++) pthread_join(b->threads[i], NULL);
}

/* -- Input ------------------------------------------------------------------------------------ */

typedef struct {
    const options *op;
    int file;                   /* the next input */
    FILE *f;                    /* the JSONL file being read */
    long line;
} reader;

static char *read_file(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) die("cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *s = xrealloc(NULL, cap);
    for (;;) {
        n += fread(s + n, 1, cap - n, f);
        if (n < cap) break;
        s = xrealloc(s, cap *= 2);
    }
    if (ferror(f)) die("cannot read '%s': %s", path, strerror(errno));
    if (f != stdin) fclose(f);
    *len = n;
    return s;
}

/* The next document into d; 0 at the end of the inputs. */
static int read_doc(reader *r, doc *d)
{
    const options *op = r->op;
    memset(d, 0, sizeof *d);
    if (!op->jsonl) {
        if (r->file == op->ninputs) return 0;
        d->file = op->inputs[r->file++];
        d->text = read_file(d->file, &d->len);
        return 1;
    }
    for (;;) {
        if (!r->f) {
            if (r->file == op->ninputs) return 0;
            d->file = op->inputs[r->file];
            r->f = strcmp(d->file, "-") ? fopen(d->file, "rb") : stdin;
            if (!r->f) die("cannot open '%s': %s", d->file, strerror(errno));
            r->line = 0;
        }
        d->file = op->inputs[r->file];
        size_t cap = 0;
        ssize_t n = getline(&d->text, &cap, r->f);
        if (n < 0) {
            if (ferror(r->f)) die("cannot read '%s': %s", d->file, strerror(errno));
            if (r->f != stdin) fclose(r->f);
            r->f = NULL;
            r->file++;
            free(d->text);
            d->text = NULL;
            continue;
        }
        r->line++;
        size_t len = (size_t)n;
        while (len && (d->text[len - 1] == '\n' || d->text[len - 1] == '\r')) len--;
        size_t s = 0;
        while (s < len && (d->text[s] == ' ' || d->text[s] == '\t')) s++;
        if (s == len) {   /* a blank line is no document (Megatron would stop at it) */
            free(d->text);
            d->text = NULL;
            continue;
        }
        d->len = len;
        d->line = r->line;
        return 1;
    }
}

/* -- Output ----------------------------------------------------------------------------------- */

typedef struct {
    out_file bin, idx;          /* Megatron: both; -o: bin only */
    int width;                  /* bytes per id */
    int code;                   /* Megatron dtype code */
    int32_t *len;               /* Megatron: (nseq) ids of each document */
    long long nseq, seqcap, ndoc, doccap;
    long long ntok;
    int64_t *docidx;            /* (ndoc + 1) Megatron's document index: sequences before */
} sink;

static void sink_put(sink *s, const int32_t *ids, size_t n)
{
    unsigned char buf[4096];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        for (int b = 0; b < s->width; b++) buf[k++] = (unsigned char)(v >> (8 * b));
        if (k + 4 > sizeof buf || i + 1 == n) {
            if (fwrite(buf, 1, k, s->bin.f) != k)
                die("cannot write '%s': %s", s->bin.tmp, strerror(errno));
            k = 0;
        }
    }
    s->ntok += (long long)n;
}

/* A Megatron document: one sequence of its ids (none when it has none), one index entry. */
static void sink_doc(sink *s, const int32_t *ids, size_t n, int megatron)
{
    sink_put(s, ids, n);
    if (!megatron) return;
    if (n > INT32_MAX) die("a document of %zu tokens: Megatron's index holds int32 lengths", n);
    if (n) {
        if (s->nseq == s->seqcap) {
            s->seqcap = 2 * s->seqcap + 1024;
            s->len = xrealloc(s->len, (size_t)s->seqcap * sizeof *s->len);
        }
        s->len[s->nseq++] = (int32_t)n;
    }
    if (s->ndoc + 2 > s->doccap) {
        s->doccap = 2 * s->doccap + 1024;
        s->docidx = xrealloc(s->docidx, (size_t)s->doccap * sizeof *s->docidx);
    }
    s->docidx[++s->ndoc] = s->nseq;
}

/* PREFIX.idx as Megatron's MMapIndexedDataset writes it: magic, version 1, dtype code,
** sequence count, document-index length; lengths (int32), byte offsets (int64), the
** document index (int64). */
static void write_idx(sink *s)
{
    FILE *f = s->idx.f;
    fwrite(MM_MAGIC, 1, sizeof MM_MAGIC, f);
    put_le(f, MM_VERSION, 8);
    put_le(f, (uint64_t)s->code, 1);
    put_le(f, (uint64_t)s->nseq, 8);
    put_le(f, (uint64_t)s->ndoc + 1, 8);
    for (long long i = 0; i < s->nseq; i++) put_le(f, (uint32_t)s->len[i], 4);
    uint64_t at = 0;
    for (long long i = 0; i < s->nseq; i++) {
        put_le(f, at, 8);
        at += (uint64_t)s->len[i] * (uint64_t)s->width;
    }
    for (long long i = 0; i <= s->ndoc; i++) put_le(f, (uint64_t)s->docidx[i], 8);
}

/* -- Decoding --------------------------------------------------------------------------------- */

static void put_text(const tok_model *tok, long long id, const char *where)
{
    if (!tok) {
        if (id < 0 || id > 255) die("%s: id %lld: byte tokens are 0-255 (--tokenizer for real "
                                    "ones)", where, id);
        putchar((int)id);
        return;
    }
    size_t n;
    const char *s = id < 0 || id > INT32_MAX ? NULL : tok_bytes(tok, (int32_t)id, &n);
    if (!s) die("%s: id %lld is not in the vocabulary (%d ids)", where, id, tok_vocab_size(tok));
    fwrite(s, 1, n, stdout);
}

static int64_t get_le(const unsigned char *p, int bytes, int sign)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    if (sign && bytes < 8 && (v >> (8 * bytes - 1)) & 1) v |= ~(uint64_t)0 << (8 * bytes);
    return (int64_t)v;
}

static void decode_tokens(const tok_model *tok, const unsigned char *p, size_t n, int width,
                          int sign, const char *where)
{
    for (size_t i = 0; i < n; i++) put_text(tok, get_le(p + i * (size_t)width, width, sign), where);
}

/* Print the text of a dataset: a Megatron PREFIX (.bin/.idx), an llm.c shard or a nanoGPT .bin. */
static void decode_file(const tok_model *tok, const char *path)
{
    size_t n = strlen(path);
    char *stem = xstrcat3(path, "", "");
    if (n > 4 && (!strcmp(path + n - 4, ".bin") || !strcmp(path + n - 4, ".idx")))
        stem[n - 4] = 0;
    char *idx = xstrcat3(stem, ".idx", ""), *binp = xstrcat3(stem, ".bin", "");
    size_t ilen, blen;
    if (access(idx, F_OK) == 0) {
        unsigned char *h = (unsigned char *)read_file(idx, &ilen);
        unsigned char *b = (unsigned char *)read_file(binp, &blen);
        if (ilen < MM_HEADER || memcmp(h, MM_MAGIC, sizeof MM_MAGIC))
            die("%s: not a Megatron index (no MMIDIDX header)", idx);
        int code = h[17];
        static const int width[9] = { 0, 1, 1, 2, 4, 8, 0, 0, 2 };
        if (get_le(h + 9, 8, 0) != MM_VERSION || code < 1 || code > 8 || !width[code])
            die("%s: version %lld, dtype code %d: version 1 with an integer dtype expected",
                idx, (long long)get_le(h + 9, 8, 0), code);
        uint64_t nseq = (uint64_t)get_le(h + 18, 8, 0);
        if (nseq > ilen / 12 || MM_HEADER + 12 * nseq > ilen)
            die("%s: truncated (%llu sequences announced)", idx, (unsigned long long)nseq);
        for (uint64_t i = 0; i < nseq; i++) {
            uint64_t len = (uint64_t)get_le(h + MM_HEADER + 4 * i, 4, 0);
            uint64_t at = (uint64_t)get_le(h + MM_HEADER + 4 * nseq + 8 * i, 8, 0);
            if (at > blen || len * (uint64_t)width[code] > blen - at)
                die("%s: sequence %llu lies past the end of %s", idx, (unsigned long long)i,
                    binp);
            decode_tokens(tok, b + at, len, width[code], code != MM_UINT8 && code != MM_UINT16,
                          binp);
        }
        free(h);
        free(b);
    } else {
        unsigned char *b = (unsigned char *)read_file(path, &blen);
        size_t skip = 0, count = blen / 2;
        if (blen >= 4 * LLMC_HEADER_INTS && get_le(b, 4, 1) == LLMC_MAGIC) {
            skip = 4 * LLMC_HEADER_INTS;
            count = (size_t)get_le(b + 8, 4, 1);
            if (count > (blen - skip) / 2) die("%s: llm.c shard shorter than its header says",
                                               path);
        } else if (blen % 2) die("%s: odd size: neither a nanoGPT .bin (uint16 ids) nor a "
                                 "Megatron dataset (no %s)", path, idx);
        decode_tokens(tok, b + skip, count, 2, 0, path);
        free(b);
    }
    free(stem);
    free(idx);
    free(binp);
}

/* Whitespace-separated ids on stdin (commas and brackets too: a JSON list will do). */
static void decode_stdin(const tok_model *tok)
{
    int c;
    long long id = 0;
    int digits = 0;
    while ((c = getchar()) != EOF) {
        if (c >= '0' && c <= '9') {
            if (id > INT32_MAX) die("stdin: id %lld...: too large", id);
            id = id * 10 + (c - '0');
            digits = 1;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == '[' ||
                   c == ']') {
            if (digits) put_text(tok, id, "stdin");
            id = 0, digits = 0;
        } else die("stdin: '%c': token ids (numbers separated by white space) expected", c);
    }
    if (digits) put_text(tok, id, "stdin");
}

/* -- Main ------------------------------------------------------------------------------------- */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_WORKERS ? MAX_WORKERS : (int)n;
}

int main(int argc, char **argv)
{
    options op = { 0 };
    parse_args(&op, argc, argv);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);

    tok_model *tok = NULL;
    if (op.tokenizer) {
        char err[1024];
        if (!(tok = tok_load(op.tokenizer, err, sizeof err))) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
    }
    if (op.decode) {
        if (op.ninputs > 1) die("--decode takes one dataset (or ids on stdin)");
        if (op.ninputs) decode_file(tok, op.inputs[0]);
        else decode_stdin(tok);
        if (fflush(stdout)) die("cannot write the text: %s", strerror(errno));
        tok_free(tok);
        return 0;
    }
    int nout = !!op.prefix + !!op.out + op.print;
    if (nout != 1 || !op.ninputs) {
        if (nout > 1) fprintf(stderr, "%s: error: --output-prefix, -o and --print: choose one\n",
                              progname);
        usage(stderr);
        return 2;
    }
    if (op.llmc && !op.out) die("--llmc goes with -o FILE");
    if (op.out && op.nkeys > 1) die("-o writes one file: one --json-keys key (or "
                                    "--output-prefix for a dataset per key)");
    int vocab = tok ? tok_vocab_size(tok) : 256;
    int eod = tok ? tok_eod_id(tok) : -1;
    if (op.eod && eod < 0)
        die("--append-eod: %s has no end-of-document token (<|endoftext|>, <|end_of_text|>, "
            "</s>)", tok ? op.tokenizer : "byte tokens (no --tokenizer)");
    if (op.out && vocab > NANOGPT_VOCAB)
        die("-o %s: a vocabulary of %d ids does not fit the uint16 ids of a nanoGPT .bin or "
            "llm.c shard (at most %d): write a Megatron dataset (--output-prefix), which holds "
            "int32 ids", op.out, vocab, NANOGPT_VOCAB);

    /* the outputs: one sink per key */
    sink sinks[MAX_KEYS];
    memset(sinks, 0, sizeof sinks);
    for (int k = 0; k < op.nkeys && !op.print; k++) {
        sink *s = &sinks[k];
        if (op.prefix) {
            char *stem = xstrcat3(op.prefix, "_", op.keys[k]);
            s->code = vocab < MEGATRON_UINT16_BELOW ? MM_UINT16 : MM_INT32;
            s->width = s->code == MM_UINT16 ? 2 : 4;
            out_open(&s->bin, xstrcat3(stem, "_document", ".bin"));
            out_open(&s->idx, xstrcat3(stem, "_document", ".idx"));
            s->doccap = 1024;
            s->docidx = xrealloc(NULL, (size_t)s->doccap * sizeof *s->docidx);
            s->docidx[0] = 0;
            free(stem);
        } else {
            s->width = 2;
            out_open(&s->bin, xstrcat3(op.out, "", ""));
            if (op.llmc) for (int i = 0; i < LLMC_HEADER_INTS; i++) put_le(s->bin.f, 0, 4);
        }
    }

    int workers = op.workers ? op.workers : online_cpus();
    static batch b;
    b.op = &op, b.tok = tok, b.eod = eod;
    start_workers(&b, workers);
    int maxdocs = BATCH_DOCS * workers;
    b.docs = xrealloc(NULL, (size_t)maxdocs * sizeof *b.docs);
    reader r = { .op = &op };
    long long ndocs = 0, bytes = 0, ntok = 0;
    double t0 = now(), shown = t0;
    int tty = isatty(2) && !op.quiet, more = 1;
    while (more) {
        /* read a batch, encode it on the workers, write it in input order */
        size_t batch_bytes = 0;
        b.ndocs = 0;
        while (b.ndocs < maxdocs && batch_bytes < (size_t)BATCH_BYTES * (size_t)workers) {
            if (!(more = read_doc(&r, &b.docs[b.ndocs]))) break;
            batch_bytes += b.docs[b.ndocs++].len;
        }
        encode_batch(&b);
        for (int i = 0; i < b.ndocs; i++) {
            doc *d = &b.docs[i];
            if (d->err) die("%s", d->err);
            for (int k = 0; k < op.nkeys; k++) {
                if (op.print) {
                    ntok += (long long)d->nids[k];
                    for (size_t j = 0; j < d->nids[k]; j++)
                        printf(j ? " %d" : "%d", d->ids[k][j]);
                    putchar('\n');
                } else sink_doc(&sinks[k], d->ids[k], d->nids[k], op.prefix != NULL);
                free(d->ids[k]);
            }
            free(d->text);
        }
        ndocs += b.ndocs;
        bytes += (long long)batch_bytes;
        if (tty && now() - shown > 0.5) {
            shown = now();
            fprintf(stderr, "\r%s: %lld documents, %.1f MB, %.1f MB/s ", progname, ndocs,
                    (double)bytes / 1e6, (double)bytes / 1e6 / (shown - t0));
        }
    }
    stop_workers(&b);
    if (op.print && (fflush(stdout) || ferror(stdout)))
        die("cannot write the ids: %s", strerror(errno));

    /* finish the files, then rename them all */
    for (int k = 0; k < op.nkeys && !op.print; k++) {
        sink *s = &sinks[k];
        ntok += s->ntok;
        if (op.llmc) {
            if (s->ntok > INT32_MAX) die("%lld tokens: too many for an llm.c shard", s->ntok);
            rewind(s->bin.f);
            put_le(s->bin.f, LLMC_MAGIC, 4);
            put_le(s->bin.f, LLMC_VERSION, 4);
            put_le(s->bin.f, (uint64_t)s->ntok, 4);
        }
        out_close(&s->bin);
        if (op.prefix) {
            write_idx(s);
            out_close(&s->idx);
        }
    }
    for (int k = 0; k < op.nkeys && !op.print; k++) {
        out_commit(&sinks[k].bin);
        if (op.prefix) out_commit(&sinks[k].idx);
    }
    double dt = now() - t0;
    if (!op.quiet) {
        if (tty) fputc('\r', stderr);
        fprintf(stderr, "%s: %lld documents, %lld tokens, %.1f MB in %.2f s (%.1f MB/s)",
                progname, ndocs, ntok, (double)bytes / 1e6, dt,
                dt > 0 ? (double)bytes / 1e6 / dt : 0.0);
        for (int k = 0; k < op.nkeys && !op.print; k++)
            fprintf(stderr, " -> %s", sinks[k].bin.path);
        fputc('\n', stderr);
    }
    for (int k = 0; k < op.nkeys && !op.print; k++) {
        sink *s = &sinks[k];
        free(s->len), free(s->docidx), free(s->bin.path), free(s->bin.tmp);
        free(s->idx.path), free(s->idx.tmp);
    }
    free(b.docs);
    tok_free(tok);
    return 0;
}
