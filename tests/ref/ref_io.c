/*
** ref_io.c: the reference's file I/O -- safetensors (a small JSON header parser, F32/BF16/F16/F64
** reading, F32 writing through a temporary file and rename), whole-model load/save in Hugging Face
** GPT-2 or Llama names (the model's tensor table), and token data files with the fixed batching
** of tests/ref/README.md. No model math here (gpt2_ref.c).
** Every error is printed as "path: error: message" and reported by returning -1.
*/
#include "ref_io.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LOAD_ERRORS 20

/* -- Errors and files ------------------------------------------------------------------------- */

static int file_error(const char *path, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: error: ", path);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return -1;
}

/* Read the whole file into *bytes (caller frees) and its size into *size. */
static int read_file(const char *path, unsigned char **bytes, size_t *size)
{
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return file_error(path, "cannot open: %s", strerror(errno));
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = ref_xmalloc(cap);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            unsigned char *grown = realloc(buf, cap);
            if (grown == NULL) {
                free(buf);
                fclose(fp);
                return file_error(path, "out of memory reading the file");
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0)
            break;
    }
    int failed = ferror(fp);
    fclose(fp);
    if (failed) {
        free(buf);
        return file_error(path, "read error");
    }
    *bytes = buf;
    *size = n;
    return 0;
}

static uint64_t le_u64(const unsigned char *p)
{
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

static uint32_t le_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int32_t le_i32(const unsigned char *p)
{
    uint32_t u = le_u32(p);
    int32_t i;
    memcpy(&i, &u, sizeof i);
    return i;
}

/* -- safetensors: dtypes ---------------------------------------------------------------------- */

/* Element sizes of the dtypes the format defines; the loader reads only the float ones. */
static const struct {
    const char *name;
    size_t size;
    int is_float;   /* 1: ref_st_read converts it to double */
} st_dtypes[] = {
    {"F64", 8, 1}, {"F32", 4, 1}, {"F16", 2, 1}, {"BF16", 2, 1},
    {"I64", 8, 0}, {"I32", 4, 0}, {"I16", 2, 0}, {"I8", 1, 0},
    {"U64", 8, 0}, {"U32", 4, 0}, {"U16", 2, 0}, {"U8", 1, 0}, {"BOOL", 1, 0},
    {"F8_E4M3", 1, 0}, {"F8_E5M2", 1, 0},
};

static int st_dtype_index(const char *name)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(st_dtypes[i].name, name) == 0)
            return (int)i;
    return -1;
}

/* IEEE half (1 sign, 5 exponent, 10 mantissa bits) to double, exactly. */
static double half_to_double(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double x;
    if (exp == 0)
        x = ldexp((double)mant, -24);                       /* zero and subnormals */
    else if (exp == 31)
        x = mant ? NAN : INFINITY;
    else
        x = ldexp((double)(mant | 0x400), exp - 25);        /* 1.mant * 2^(exp-15) */
    return sign ? -x : x;
}

/* bfloat16 is the top half of a float32. */
static double bf16_to_double(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* -- safetensors: header parser --------------------------------------------------------------- */
/* Enough JSON for the format: one object of name -> {dtype, shape, data_offsets} plus an
** optional "__metadata__" object; any other value is skipped without being interpreted. */

typedef struct json {
    const char *path;
    const unsigned char *s;
    size_t pos, end;
} json;

static int j_err(json *j, const char *what)
{
    return file_error(j->path, "bad safetensors header at byte %zu: %s", 8 + j->pos, what);
}

static void j_ws(json *j)
{
    while (j->pos < j->end && (j->s[j->pos] == ' ' || j->s[j->pos] == '\t' ||
                               j->s[j->pos] == '\n' || j->s[j->pos] == '\r'))
        j->pos++;
}

static int j_peek(json *j)
{
    j_ws(j);
    return j->pos < j->end ? j->s[j->pos] : -1;
}

static int j_expect(json *j, int c)
{
    if (j_peek(j) != c) {
        char what[32];
        snprintf(what, sizeof what, "expected '%c'", c);
        return j_err(j, what);
    }
    j->pos++;
    return 0;
}

/* After a member or element: 1 after a ',', 0 after 'close', else reports and returns -1. */
static int j_sep(json *j, int close)
{
    int c = j_peek(j);
    if (c == ',' || c == close) {
        j->pos++;
        return c == ',';
    }
    char what[32];
    snprintf(what, sizeof what, "expected ',' or '%c'", close);
    return j_err(j, what);
}

/* A string into out[cap] (NUL-terminated); simple escapes only, no \u. */
static int j_string(json *j, char *out, size_t cap)
{
    if (j_expect(j, '"') < 0)
        return -1;
    size_t n = 0;
    while (j->pos < j->end && j->s[j->pos] != '"') {
        int c = j->s[j->pos++];
        if (c == '\\') {
            if (j->pos >= j->end)
                break;
            c = j->s[j->pos++];
            switch (c) {
            case '"': case '\\': case '/': break;
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            default: return j_err(j, "unsupported escape in string");
            }
        }
        if (n + 1 >= cap)
            return j_err(j, "string too long");
        out[n++] = (char)c;
    }
    if (j->pos >= j->end)
        return j_err(j, "unterminated string");
    j->pos++;
    out[n] = '\0';
    return 0;
}

/* A non-negative integer. */
static int j_uint(json *j, unsigned long long *out)
{
    j_ws(j);
    if (j->pos >= j->end || j->s[j->pos] < '0' || j->s[j->pos] > '9')
        return j_err(j, "expected a non-negative integer");
    unsigned long long x = 0;
    while (j->pos < j->end && j->s[j->pos] >= '0' && j->s[j->pos] <= '9') {
        if (x > (~0ULL - 9) / 10)
            return j_err(j, "integer too large");
        x = x * 10 + (unsigned)(j->s[j->pos++] - '0');
    }
    *out = x;
    return 0;
}

/* Skip any JSON value (depth-limited). */
static int j_skip(json *j, int depth)
{
    char tmp[256];
    int c = j_peek(j);
    if (depth > 32)
        return j_err(j, "nesting too deep");
    if (c == '"')
        return j_string(j, tmp, sizeof tmp);
    if (c == '{' || c == '[') {
        int close = c == '{' ? '}' : ']';
        j->pos++;
        if (j_peek(j) == close) {
            j->pos++;
            return 0;
        }
        for (;;) {
            if (c == '{' && (j_string(j, tmp, sizeof tmp) < 0 || j_expect(j, ':') < 0))
                return -1;
            if (j_skip(j, depth + 1) < 0)
                return -1;
            int more = j_sep(j, close);
            if (more != 1)
                return more;
        }
    }
    /* number, true, false, null */
    size_t start = j->pos;
    while (j->pos < j->end && j->s[j->pos] != '\0' &&
           strchr("+-.0123456789eEtruefalsn", j->s[j->pos]) != NULL)
        j->pos++;
    return j->pos > start ? 0 : j_err(j, "expected a value");
}

/* An array of at most 'max' non-negative integers; count in *n. */
static int j_uint_array(json *j, unsigned long long *out, int max, int *n)
{
    *n = 0;
    if (j_expect(j, '[') < 0)
        return -1;
    if (j_peek(j) == ']') {
        j->pos++;
        return 0;
    }
    for (;;) {
        if (*n == max)
            return j_err(j, "array too long");
        if (j_uint(j, &out[(*n)++]) < 0)
            return -1;
        int more = j_sep(j, ']');
        if (more != 1)
            return more;
    }
}

/* The object describing one tensor, whose name is already in t->name. */
static int j_tensor(json *j, ref_st_tensor *t)
{
    char key[64];
    unsigned long long vals[REF_ST_MAX_DIMS];
    int have_dtype = 0, have_shape = 0, have_offsets = 0, n;
    if (j_expect(j, '{') < 0)
        return -1;
    if (j_peek(j) == '}')
        return j_err(j, "empty tensor entry");
    for (;;) {
        if (j_string(j, key, sizeof key) < 0 || j_expect(j, ':') < 0)
            return -1;
        if (strcmp(key, "dtype") == 0) {
            if (j_string(j, t->dtype, sizeof t->dtype) < 0)
                return -1;
            have_dtype = 1;
        } else if (strcmp(key, "shape") == 0) {
            if (j_uint_array(j, vals, REF_ST_MAX_DIMS, &n) < 0)
                return -1;
            t->ndim = n;
            for (int i = 0; i < n; i++) {
                if (vals[i] > 0x7fffffffULL)
                    return j_err(j, "dimension too large");
                t->shape[i] = (long)vals[i];
            }
            have_shape = 1;
        } else if (strcmp(key, "data_offsets") == 0) {
            if (j_uint_array(j, vals, 2, &n) < 0)
                return -1;
            if (n != 2)
                return j_err(j, "data_offsets needs two integers");
            t->begin = (size_t)vals[0];
            t->end = (size_t)vals[1];
            have_offsets = 1;
        } else if (j_skip(j, 0) < 0) {
            return -1;
        }
        int more = j_sep(j, '}');
        if (more < 0)
            return -1;
        if (more == 0)
            break;
    }
    if (!have_dtype || !have_shape || !have_offsets)
        return file_error(j->path, "tensor '%s' lacks %s", t->name,
                          !have_dtype ? "a dtype" : !have_shape ? "a shape" : "data_offsets");
    return 0;
}

/* -- safetensors: reading --------------------------------------------------------------------- */

/* A header entry must have a known dtype and data_offsets inside the data section that hold
** exactly its shape's elements. */
static int check_tensor(const char *path, const ref_st_tensor *t, size_t data_size)
{
    int d = st_dtype_index(t->dtype);
    if (d < 0)
        return file_error(path, "tensor '%s' has unknown dtype '%s'", t->name, t->dtype);
    size_t numel = 1;
    for (int k = 0; k < t->ndim; k++) {
        size_t dim = (size_t)t->shape[k];
        if (dim != 0 && numel > data_size / dim)
            return file_error(path, "tensor '%s': shape needs more elements than the file "
                              "has bytes", t->name);
        numel *= dim;
    }
    if (t->begin > t->end || t->end > data_size)
        return file_error(path, "tensor '%s': data_offsets [%zu,%zu] outside the %zu data "
                          "bytes", t->name, t->begin, t->end, data_size);
    if (t->end - t->begin != numel * st_dtypes[d].size)
        return file_error(path, "tensor '%s': %zu data bytes for %zu elements of %s", t->name,
                          t->end - t->begin, numel, t->dtype);
    return 0;
}

/*
** Read and check the safetensors file 'path' (kept by pointer, not copied): header length,
** JSON header, known dtypes, data offsets inside the file and matching dtype x shape.
** On success fills *f (release with ref_st_close) and returns 0; on error reports and returns
** -1 with *f empty.
*/
int ref_st_open(ref_st_file *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    if (read_file(path, &f->bytes, &f->size) < 0)
        return -1;
    if (f->size < 8) {
        file_error(path, "not a safetensors file: %zu bytes, no header length", f->size);
        goto fail;
    }
    uint64_t hlen = le_u64(f->bytes);
    if (hlen > f->size - 8) {
        file_error(path, "not a safetensors file: header length %llu exceeds the file size %zu",
                   (unsigned long long)hlen, f->size);
        goto fail;
    }
    f->data_start = 8 + (size_t)hlen;
    size_t data_size = f->size - f->data_start;

    json j = {path, f->bytes + 8, 0, (size_t)hlen};
    int cap = 16;
    f->tensors = ref_xcalloc((size_t)cap, sizeof *f->tensors);
    if (j_expect(&j, '{') < 0)
        goto fail;
    if (j_peek(&j) == '}') {
        j.pos++;
    } else {
        for (;;) {
            char name[REF_NAME_MAX];
            if (j_string(&j, name, sizeof name) < 0 || j_expect(&j, ':') < 0)
                goto fail;
            if (strcmp(name, "__metadata__") == 0) {
                if (j_skip(&j, 0) < 0)
                    goto fail;
            } else {
                if (ref_st_find(f, name) != NULL) {
                    file_error(path, "tensor '%s' appears twice in the header", name);
                    goto fail;
                }
                if (f->ntensors == cap) {
                    cap *= 2;
                    ref_st_tensor *grown = realloc(f->tensors, (size_t)cap * sizeof *grown);
                    if (grown == NULL) {
                        file_error(path, "out of memory");
                        goto fail;
                    }
                    f->tensors = grown;
                }
                ref_st_tensor *t = &f->tensors[f->ntensors];
                memset(t, 0, sizeof *t);
                snprintf(t->name, sizeof t->name, "%s", name);
                if (j_tensor(&j, t) < 0)
                    goto fail;
                f->ntensors++;
                if (check_tensor(path, t, data_size) < 0)
                    goto fail;
            }
            int more = j_sep(&j, '}');
            if (more < 0)
                goto fail;
            if (more == 0)
                break;
        }
    }
    if (j_peek(&j) != -1) {
        j_err(&j, "trailing characters after the header object");
        goto fail;
    }
    return 0;
fail:
    ref_st_close(f);
    return -1;
}

/*
** Release what ref_st_open allocated; *f is left empty (safe to call twice).
*/
void ref_st_close(ref_st_file *f)
{
    free(f->bytes);
    free(f->tensors);
    memset(f, 0, sizeof *f);
}

/*
** The header entry named 'name', or NULL.
*/
const ref_st_tensor *ref_st_find(const ref_st_file *f, const char *name)
{
    for (int i = 0; i < f->ntensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

/*
** Number of elements of 't' (1 for a 0-d tensor).
*/
size_t ref_st_numel(const ref_st_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

/*
** Convert tensor 't' of open file 'f' to doubles in dst[ref_st_numel(t)] (exactly: every
** F32, BF16 and F16 value is a double). Reports and returns -1 for a non-float dtype.
*/
int ref_st_read(const ref_st_file *f, const ref_st_tensor *t, double *dst)
{
    const unsigned char *p = f->bytes + f->data_start + t->begin;
    size_t n = ref_st_numel(t);
    if (strcmp(t->dtype, "F32") == 0) {
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = le_u32(p + 4 * i);
            float x;
            memcpy(&x, &bits, sizeof x);
            dst[i] = x;
        }
    } else if (strcmp(t->dtype, "F64") == 0) {
        for (size_t i = 0; i < n; i++) {
            uint64_t bits = le_u64(p + 8 * i);
            memcpy(&dst[i], &bits, sizeof(double));
        }
    } else if (strcmp(t->dtype, "BF16") == 0) {
        for (size_t i = 0; i < n; i++)
            dst[i] = bf16_to_double((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    } else if (strcmp(t->dtype, "F16") == 0) {
        for (size_t i = 0; i < n; i++)
            dst[i] = half_to_double((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    } else {
        return file_error(f->path, "tensor '%s' has dtype %s; expected F32, BF16, F16 or F64",
                          t->name, t->dtype);
    }
    return 0;
}

/* -- safetensors: writing --------------------------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;

static void sb_addf(sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (b->s && (size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        b->cap = (b->cap + (size_t)k + 1) * 2;
        char *grown = realloc(b->s, b->cap);
        if (grown == NULL) {
            fprintf(stderr, "gpt2_ref: out of memory\n");
            exit(1);
        }
        b->s = grown;
    }
}

static int write_all(FILE *fp, const void *p, size_t n)
{
    return fwrite(p, 1, n, fp) == n ? 0 : -1;
}

/*
** Write 'n' tensors to the safetensors file 'path' as F32 (values rounded to float), in the
** given order: 8-byte little-endian header length, then the header
**   {"__metadata__":{"format":"pt"},"<name>":{"dtype":"F32","shape":[..],"data_offsets":[b,e]},..}
** padded with spaces to a multiple of 8 bytes, then the data, contiguous, in the same order.
** The file is written to "<path>.tmp" and renamed over 'path' only when complete.
** Names must not need JSON escaping. Reports and returns -1 on an I/O error.
*/
int ref_st_write(const char *path, const ref_st_entry *entries, int n)
{
    sbuf h = {0};
    size_t off = 0;
    sb_addf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        const ref_st_entry *e = &entries[i];
        size_t numel = 1;
        sb_addf(&h, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", e->name);
        for (int d = 0; d < e->ndim; d++) {
            sb_addf(&h, "%s%ld", d ? "," : "", e->shape[d]);
            numel *= (size_t)e->shape[d];
        }
        sb_addf(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + 4 * numel);
        off += 4 * numel;
    }
    sb_addf(&h, "}");
    while (h.n % 8 != 0)
        sb_addf(&h, " ");

    size_t tmplen = strlen(path) + 5;
    char *tmp = ref_xmalloc(tmplen);
    snprintf(tmp, tmplen, "%s.tmp", path);
    FILE *fp = fopen(tmp, "wb");
    if (fp == NULL) {
        file_error(tmp, "cannot write: %s", strerror(errno));
        free(tmp);
        free(h.s);
        return -1;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)h.n >> (8 * i));
    int bad = write_all(fp, len8, 8) < 0 || write_all(fp, h.s, h.n) < 0;
    for (int i = 0; i < n && !bad; i++) {
        const ref_st_entry *e = &entries[i];
        size_t numel = 1;
        for (int d = 0; d < e->ndim; d++)
            numel *= (size_t)e->shape[d];
        for (size_t k = 0; k < numel && !bad; k++) {
            float x = (float)e->data[k];
            uint32_t bits;
            unsigned char b4[4];
            memcpy(&bits, &x, sizeof bits);
            for (int q = 0; q < 4; q++)
                b4[q] = (unsigned char)(bits >> (8 * q));
            bad = write_all(fp, b4, 4) < 0;
        }
    }
    if (fclose(fp) != 0)
        bad = 1;
    if (!bad && rename(tmp, path) != 0) {
        file_error(path, "cannot rename %s: %s", tmp, strerror(errno));
        remove(tmp);
        free(tmp);
        free(h.s);
        return -1;
    }
    if (bad) {
        file_error(tmp, "write failed");
        remove(tmp);
    }
    free(tmp);
    free(h.s);
    return bad ? -1 : 0;
}

/* -- Whole model ------------------------------------------------------------------------------ */

/* Buffers that Hugging Face checkpoints carry next to the parameters: the causal masks of the
** original gpt2 checkpoint ("h.<i>.attn.bias", "h.<i>.attn.masked_bias") and the rotary
** frequencies of older Llama ones ("model.layers.<i>.self_attn.rotary_emb.inv_freq"). They are
** not parameters: ignored. */
static int is_buffer(const char *name)
{
    const char *p = name;
    int gpt2 = strncmp(p, "h.", 2) == 0;
    if (!gpt2 && strncmp(p, "model.layers.", 13) != 0)
        return 0;
    p += gpt2 ? 2 : 13;
    if (*p < '0' || *p > '9')
        return 0;
    while (*p >= '0' && *p <= '9')
        p++;
    if (!gpt2)
        return strcmp(p, ".self_attn.rotary_emb.inv_freq") == 0;
    return strcmp(p, ".attn.bias") == 0 || strcmp(p, ".attn.masked_bias") == 0;
}

static void shape_str(char *out, size_t cap, int ndim, const long *shape)
{
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, "%s%ld", d ? "," : "", shape[d]);
    if (n < cap)
        snprintf(out + n, cap - n, "]");
}

/*
** Load every parameter of 'm' from the safetensors file 'path' (Hugging Face GPT-2 or Llama
** names and shapes, F32/BF16/F16/F64). Reports every missing, mis-shaped, non-float and
** unexpected tensor (up to 20, in model order, then the unexpected ones in file order) and
** returns -1 if there was any; the buffers of is_buffer are ignored.
** Does not touch the optimizer state.
*/
int ref_model_load(ref_model *m, const char *path)
{
    ref_st_file f;
    int nerr = 0;
    if (ref_st_open(&f, path) < 0)
        return -1;
    for (int i = 0; i < m->ntensors && nerr < MAX_LOAD_ERRORS; i++) {
        const ref_tensor *want = &m->tensors[i];
        const ref_st_tensor *t = ref_st_find(&f, want->name);
        if (t == NULL) {
            file_error(path, "missing tensor '%s'", want->name);
            nerr++;
            continue;
        }
        int same = t->ndim == want->ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = t->shape[d] == want->shape[d];
        if (!same) {
            char got[128], exp[64];
            shape_str(got, sizeof got, t->ndim, t->shape);
            shape_str(exp, sizeof exp, want->ndim, want->shape);
            file_error(path, "tensor '%s' has shape %s, expected %s", want->name, got, exp);
            nerr++;
            continue;
        }
        if (ref_st_read(&f, t, m->params + want->offset) < 0)
            nerr++;
    }
    for (int i = 0; i < f.ntensors && nerr < MAX_LOAD_ERRORS; i++) {
        const char *name = f.tensors[i].name;
        if (ref_model_find(m, name) == NULL && !is_buffer(name)) {
            file_error(path, "unexpected tensor '%s'", name);
            nerr++;
        }
    }
    if (nerr >= MAX_LOAD_ERRORS)
        file_error(path, "too many errors, stopped");
    ref_st_close(&f);
    return nerr ? -1 : 0;
}

/*
** Save the parameters of 'm' as F32 safetensors in the model's canonical tensor order (see
** ref_st_write: temporary file, then rename). Returns 0, or -1 after reporting.
*/
int ref_model_save(const ref_model *m, const char *path)
{
    ref_st_entry *e = ref_xcalloc((size_t)m->ntensors, sizeof *e);
    for (int i = 0; i < m->ntensors; i++) {
        const ref_tensor *t = &m->tensors[i];
        e[i].name = t->name;
        e[i].ndim = t->ndim;
        e[i].shape[0] = t->shape[0];
        e[i].shape[1] = t->shape[1];
        e[i].data = m->params + t->offset;
    }
    int rc = ref_st_write(path, e, m->ntensors);
    free(e);
    return rc;
}

/* -- Token data ------------------------------------------------------------------------------- */

/*
** Load the token file 'path' for a model with 'vocab' tokens and sequence length 'seq'.
** Recognised by content: a file of at least 1024 bytes whose first little-endian int32 is
** 20240520 is an llm.c shard (int32 header[256]: magic, version 1, token count; then the
** uint16 tokens, nothing after them); anything else is headerless little-endian uint16 tokens
** (nanoGPT .bin). Every token must be < vocab and there must be at least seq+1 tokens.
** On success fills *d (free with ref_data_free); else reports and returns -1.
*/
int ref_data_load(ref_data *d, const char *path, int vocab, int seq)
{
    unsigned char *bytes;
    size_t size, start = 0, ntok;
    memset(d, 0, sizeof *d);
    if (read_file(path, &bytes, &size) < 0)
        return -1;
    if (size >= REF_SHARD_HEADER_BYTES && le_i32(bytes) == REF_SHARD_MAGIC) {
        int32_t version = le_i32(bytes + 4), count = le_i32(bytes + 8);
        size_t have = size - REF_SHARD_HEADER_BYTES;
        d->is_shard = 1;
        start = REF_SHARD_HEADER_BYTES;
        if (version != 1) {
            free(bytes);
            return file_error(path, "llm.c shard version %d is not supported (only 1: uint16 "
                              "tokens)", (int)version);
        }
        if (count < 0) {
            free(bytes);
            return file_error(path, "llm.c shard header has a negative token count %d",
                              (int)count);
        }
        ntok = (size_t)count;
        if (have < 2 * ntok) {
            free(bytes);
            return file_error(path, "truncated llm.c shard: header says %zu tokens (%zu bytes), "
                              "file has %zu bytes after the header", ntok, 2 * ntok, have);
        }
        if (have > 2 * ntok) {
            free(bytes);
            return file_error(path, "llm.c shard has %zu bytes after its %zu tokens",
                              have - 2 * ntok, ntok);
        }
    } else {
        if (size % 2 != 0) {
            free(bytes);
            return file_error(path, "truncated token file: odd size %zu bytes, not whole "
                              "uint16 tokens", size);
        }
        ntok = size / 2;
    }
    d->tokens = ref_xmalloc((ntok ? ntok : 1) * sizeof(uint16_t));
    d->ntokens = ntok;
    for (size_t i = 0; i < ntok; i++) {
        d->tokens[i] = (uint16_t)(bytes[start + 2 * i] | bytes[start + 2 * i + 1] << 8);
        if (d->tokens[i] >= vocab) {
            file_error(path, "token %d at position %zu is out of range for vocab %d",
                       d->tokens[i], i, vocab);
            free(bytes);
            ref_data_free(d);
            return -1;
        }
    }
    free(bytes);
    if (ntok < (size_t)seq + 1) {
        file_error(path, "%zu tokens are too few for one sample of seq %d (need %d)", ntok, seq,
                   seq + 1);
        ref_data_free(d);
        return -1;
    }
    d->seq = seq;
    d->nsamples = (ntok - 1) / (size_t)seq;
    return 0;
}

/*
** Free what ref_data_load allocated; *d is left empty.
*/
void ref_data_free(ref_data *d)
{
    free(d->tokens);
    memset(d, 0, sizeof *d);
}

/*
** The global batch of step 'step' (from 0): for j = 0..gbs-1, sample i = (step*gbs + j) mod
** nsamples gives inputs[j,:] = tokens[i*T .. i*T+T-1] and targets[j,:] = tokens[i*T+1 .. i*T+T].
** inputs and targets are (gbs, T).
*/
void ref_data_batch(const ref_data *d, long step, int gbs, int *inputs, int *targets)
{
    size_t T = (size_t)d->seq;
    for (int j = 0; j < gbs; j++) {
        size_t i = (size_t)(((unsigned long long)step * (unsigned long long)gbs + (unsigned)j)
                            % d->nsamples);
        const uint16_t *tok = d->tokens + i * T;
        for (size_t t = 0; t < T; t++) {
            inputs[(size_t)j * T + t] = tok[t];
            targets[(size_t)j * T + t] = tok[t + 1];
        }
    }
}
