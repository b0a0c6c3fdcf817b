/*
** stcompare: compare two safetensors files tensor by tensor, list a file's tensors, or check
** that a file is well formed. A user tool (checkpoints of the generated training programs,
** the reference's and Hugging Face's); the tests use it too. Not a converter, not a viewer of
** values. Comparison is numeric in double: F64, F32, F16, BF16 and the integer dtypes.
**
**   stcompare [--atol X] [--rtol X] [--atol-max X] [--exact] [--show N] [-q] A B
**   stcompare --list FILE                    name, dtype, shape, data offsets per tensor
**   stcompare --check [--dtype D] FILE       strict structure check (see check_file)
**
** Exit: 0 same / well formed, 1 a difference or a malformed file, 2 usage error.
*/
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *progname = "stcompare";

#define MAX_DIMS   8
#define NAME_MAX_  256
#define MAX_ERRORS 20       /* --check reports at most this many problems */

/* -- Data types ------------------------------------------------------------------------------ */

/* The safetensors dtypes this tool reads: name, bytes per element. ORDER is free. */
#define ST_DTYPES(_) \
    _(F64, 8) _(F32, 4) _(F16, 2) _(BF16, 2) \
    _(I64, 8) _(I32, 4) _(I16, 2) _(I8, 1) _(U64, 8) _(U32, 4) _(U16, 2) _(U8, 1) _(BOOL, 1)

typedef enum {
#define DT_ENUM(name, size) DT_##name,
    ST_DTYPES(DT_ENUM)
#undef DT_ENUM
    DT_COUNT
} dtype;

static const struct { const char *name; int size; } dtypes[DT_COUNT] = {
#define DT_INFO(name, size) { #name, size },
    ST_DTYPES(DT_INFO)
#undef DT_INFO
};

static int dtype_from_name(const char *s)
{
    for (int i = 0; i < DT_COUNT; i++)
        if (!strcmp(dtypes[i].name, s)) return i;
    return -1;
}

static double half_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h >> 15) ? -v : v;
}

static uint64_t le_bytes(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Element i of a tensor's little-endian data as a double. */
static double element(const unsigned char *data, dtype t, size_t i)
{
    const unsigned char *p = data + i * (size_t)dtypes[t].size;
    uint64_t u = le_bytes(p, dtypes[t].size);
    switch (t) {
    case DT_F64: { double d; memcpy(&d, &u, 8); return d; }
    case DT_F32: { uint32_t w = (uint32_t)u; float f; memcpy(&f, &w, 4); return f; }
    case DT_BF16: { uint32_t w = (uint32_t)u << 16; float f; memcpy(&f, &w, 4); return f; }
    case DT_F16: return half_value((uint16_t)u);
    case DT_I64: return (double)(int64_t)u;
    case DT_I32: return (double)(int32_t)u;
    case DT_I16: return (double)(int16_t)u;
    case DT_I8: return (double)(int8_t)u;
    default: return (double)u;              /* unsigned and BOOL */
    }
}

/* -- The file -------------------------------------------------------------------------------- */

typedef struct {
    char name[NAME_MAX_];
    int dtype;                  /* index into dtypes[], -1 if unknown (then dtype_name holds it) */
    char dtype_name[16];
    int ndim;
    long long shape[MAX_DIMS];
    long long begin, end;       /* data_offsets, relative to the data section */
    int have_dtype, have_shape, have_offsets, extra_keys;
} tensor;

typedef struct {
    const char *path;
    const unsigned char *bytes; /* the whole file (mapped) */
    size_t size;
    unsigned long long hlen;    /* header length in bytes */
    size_t data0;               /* 8 + hlen */
    int n, cap;
    tensor *t;                  /* [n] in header order */
    int nerrors;                /* problems found while parsing (all reported) */
} st_file;

static void file_error(st_file *f, const char *fmt, ...)
{
    va_list ap;
    if (f->nerrors++ >= MAX_ERRORS) return;
    fprintf(stderr, "%s: error: ", f->path);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void *xrealloc(void *p, size_t bytes)
{
    p = realloc(p, bytes);
    if (!p) {
        fprintf(stderr, "%s: out of memory\n", progname);
        exit(2);
    }
    return p;
}

/* -- A JSON reader just large enough for safetensors headers --------------------------------- */

typedef struct {
    st_file *f;
    const char *p, *end;
    int bad;                    /* a syntax error was reported: stop */
} json;

static void j_fail(json *j, const char *what)
{
    if (!j->bad)
        file_error(j->f, "header: %s at byte %ld of the JSON", what,
                   (long)(j->p - (const char *)j->f->bytes - 8));
    j->bad = 1;
}

static void j_ws(json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int j_next(json *j, char c)
{
    j_ws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    return 0;
}

static void j_expect(json *j, char c)
{
    char what[32];
    if (j->bad || j_next(j, c)) return;
    snprintf(what, sizeof what, "expected '%c'", c);
    j_fail(j, what);
}

/* A string; \uXXXX escapes are kept as written (names in these files are ASCII). */
static void j_string(json *j, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    if (j->bad) return;
    if (!j_next(j, '"')) { j_fail(j, "expected a string"); return; }
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if ((unsigned char)c < 0x20) { j_fail(j, "control character in a string"); return; }
        if (c == '\\') {
            if (j->p >= j->end) break;
            c = *j->p++;
            switch (c) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': if (n + 1 < cap) out[n++] = '\\'; break;
            case '"': case '\\': case '/': break;
            default: j_fail(j, "bad escape in a string"); return;
            }
        }
        if (n + 1 >= cap) { j_fail(j, "string too long"); return; }
        out[n++] = c;
    }
    out[n] = 0;
    if (!j_next(j, '"')) j_fail(j, "unterminated string");
}

static long long j_int(json *j)
{
    char *e;
    j_ws(j);
    if (j->bad) return -1;
    if (j->p >= j->end || *j->p < '0' || *j->p > '9') {
        j_fail(j, "expected an integer");
        return -1;
    }
    errno = 0;
    long long v = strtoll(j->p, &e, 10);
    if (errno || e > j->end) { j_fail(j, "integer out of range"); return -1; }
    j->p = e;
    return v;
}

/* An array of non-negative integers into out[max]; returns the count (-1 on error). */
static int j_ints(json *j, long long *out, int max)
{
    int n = 0;
    j_expect(j, '[');
    if (j->bad) return -1;
    if (j_next(j, ']')) return 0;
    do {
        long long v = j_int(j);
        if (j->bad) return -1;
        if (n >= max) { j_fail(j, "too many dimensions"); return -1; }
        out[n++] = v;
    } while (j_next(j, ','));
    j_expect(j, ']');
    return j->bad ? -1 : n;
}

/* Skip any value (metadata and unknown keys), with a depth limit. */
static void j_skip(json *j, int depth)
{
    char tmp[NAME_MAX_];
    j_ws(j);
    if (j->bad) return;
    if (depth > 32) { j_fail(j, "nested too deeply"); return; }
    if (j->p >= j->end) { j_fail(j, "unexpected end"); return; }
    char c = *j->p;
    if (c == '"') { j_string(j, tmp, sizeof tmp); return; }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        if (j_next(j, close)) return;
        do {
            if (close == '}') { j_string(j, tmp, sizeof tmp); j_expect(j, ':'); }
            j_skip(j, depth + 1);
        } while (!j->bad && j_next(j, ','));
        j_expect(j, close);
        return;
    }
    const char *s = j->p;
    while (j->p < j->end && strchr("+-.0123456789eEtruefalsn", *j->p)) j->p++;
    if (j->p == s) j_fail(j, "unexpected character");
}

static void parse_tensor(json *j, tensor *t)
{
    char key[64];
    j_expect(j, '{');
    if (j->bad || j_next(j, '}')) return;
    do {
        long long off[3];
        j_string(j, key, sizeof key);
        j_expect(j, ':');
        if (j->bad) return;
        if (!strcmp(key, "dtype")) {
            j_string(j, t->dtype_name, sizeof t->dtype_name);
            t->dtype = dtype_from_name(t->dtype_name);
            t->have_dtype++;
        } else if (!strcmp(key, "shape")) {
            t->ndim = j_ints(j, t->shape, MAX_DIMS);
            t->have_shape++;
        } else if (!strcmp(key, "data_offsets")) {
            int n = j_ints(j, off, 3);
            if (n != 2 && !j->bad) j_fail(j, "data_offsets needs two integers");
            t->begin = off[0];
            t->end = off[1];
            t->have_offsets++;
        } else {
            t->extra_keys++;
            j_skip(j, 1);
        }
    } while (!j->bad && j_next(j, ','));
    j_expect(j, '}');
}

/* Map 'path' and parse its header. Returns 0, or -1 after reporting (then nothing to free). */
static int st_open(st_file *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        fprintf(stderr, "%s: error: cannot open: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    f->size = (size_t)st.st_size;
    if (f->size < 8) {
        fprintf(stderr, "%s: error: not a safetensors file (%zu bytes, shorter than the 8-byte "
                "header length)\n", path, f->size);
        close(fd);
        return -1;
    }
    f->bytes = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->bytes == MAP_FAILED) {
        fprintf(stderr, "%s: error: cannot map: %s\n", path, strerror(errno));
        return -1;
    }
    f->hlen = le_bytes(f->bytes, 8);
    if (f->hlen > f->size - 8) {
        fprintf(stderr, "%s: error: not a safetensors file (header length %llu, file %zu "
                "bytes)\n", path, f->hlen, f->size);
        munmap((void *)f->bytes, f->size);
        return -1;
    }
    f->data0 = 8 + (size_t)f->hlen;
    json j = { f, (const char *)f->bytes + 8, (const char *)f->bytes + f->data0, 0 };
    char name[NAME_MAX_];
    j_expect(&j, '{');
    if (!j.bad && !j_next(&j, '}')) {
        do {
            j_string(&j, name, sizeof name);
            j_expect(&j, ':');
            if (j.bad) break;
            if (!strcmp(name, "__metadata__")) { j_skip(&j, 1); continue; }
            if (f->n == f->cap) {
                f->cap = f->cap ? 2 * f->cap : 64;
                f->t = xrealloc(f->t, sizeof(tensor) * (size_t)f->cap);
            }
            tensor *t = &f->t[f->n++];
            memset(t, 0, sizeof *t);
            t->dtype = -1;
            snprintf(t->name, sizeof t->name, "%s", name);
            parse_tensor(&j, t);
        } while (!j.bad && j_next(&j, ','));
        j_expect(&j, '}');
    }
    j_ws(&j);
    if (!j.bad && j.p != j.end) j_fail(&j, "text after the JSON object");
    if (j.bad) {
        munmap((void *)f->bytes, f->size);
        free(f->t);
        return -1;
    }
    return 0;
}

static void st_close(st_file *f)
{
    munmap((void *)f->bytes, f->size);
    free(f->t);
}

static long long numel(const tensor *t)
{
    long long n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

static void shape_str(const tensor *t, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < t->ndim && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", d ? ", " : "", t->shape[d]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* Problems that make a tensor's data unreadable (reported by every mode). */
static int tensor_usable(st_file *f, const tensor *t)
{
    if (t->have_dtype != 1 || t->have_shape != 1 || t->have_offsets != 1) {
        file_error(f, "tensor '%s' needs exactly one each of dtype, shape and data_offsets",
                   t->name);
        return 0;
    }
    if (t->dtype < 0) {
        file_error(f, "tensor '%s' has unknown dtype '%s'", t->name, t->dtype_name);
        return 0;
    }
    long long bytes = numel(t) * dtypes[t->dtype].size;
    if (t->begin > t->end || t->end > (long long)(f->size - f->data0) ||
        t->end - t->begin != bytes) {
        file_error(f, "tensor '%s' has data_offsets [%lld, %lld] but needs %lld bytes within "
                   "the %zu-byte data section", t->name, t->begin, t->end, bytes,
                   f->size - f->data0);
        return 0;
    }
    return 1;
}

/* -- --list and --check ------------------------------------------------------------------------ */

static int list_file(const char *path)
{
    st_file f;
    char shape[128];
    if (st_open(&f, path)) return 1;
    for (int i = 0; i < f.n; i++) {
        const tensor *t = &f.t[i];
        shape_str(t, shape, sizeof shape);
        printf("%s %s %s %lld %lld\n", t->name, t->dtype_name, shape, t->begin, t->end);
    }
    st_close(&f);
    return 0;
}

/*
** The strict check: the header length is a multiple of 8 (so the data section is 8-byte
** aligned), the JSON is one object whose entries each have exactly dtype, shape and
** data_offsets; names are unique; the tensors, in header order, tile the data section from 0
** to the end of the file without gaps or overlaps; each spans numel * dtype size bytes; with
** 'want' >= 0 every tensor has that dtype. Reports every problem (capped) and returns 1 if any.
*/
static int check_file(const char *path, int want)
{
    st_file f;
    if (st_open(&f, path)) return 1;
    if (f.data0 % 8)
        file_error(&f, "header length %llu is not a multiple of 8 (data section not 8-byte "
                   "aligned)", f.hlen);
    long long at = 0;
    for (int i = 0; i < f.n; i++) {
        const tensor *t = &f.t[i];
        for (int k = 0; k < i; k++)
            if (!strcmp(f.t[k].name, t->name)) file_error(&f, "tensor '%s' appears twice", t->name);
        if (t->extra_keys) file_error(&f, "tensor '%s' has keys other than dtype, shape and "
                                      "data_offsets", t->name);
        if (!tensor_usable(&f, t)) continue;
        if (want >= 0 && t->dtype != want)
            file_error(&f, "tensor '%s' is %s, expected %s", t->name, t->dtype_name,
                       dtypes[want].name);
        if (t->begin != at)
            file_error(&f, "tensor '%s' starts at %lld, expected %lld (gap or overlap)",
                       t->name, t->begin, at);
        at = t->end;
    }
    if (at != (long long)(f.size - f.data0))
        file_error(&f, "tensors end at %lld but the data section has %zu bytes", at,
                   f.size - f.data0);
    int bad = f.nerrors > 0;
    if (f.nerrors > MAX_ERRORS)
        fprintf(stderr, "%s: %d more problems not shown\n", path, f.nerrors - MAX_ERRORS);
    if (!bad) printf("%s: ok (%d tensors, header %llu bytes)\n", path, f.n, f.hlen);
    st_close(&f);
    return bad;
}

/* -- Comparison ------------------------------------------------------------------------------- */

typedef struct {
    double atol, rtol;
    double atol_max;            /* plus atol_max * max|b| of each tensor */
    int exact, show, quiet;
} options;

static const tensor *find(const st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

/* Index i of a tensor as "[r, c]" (row-major coordinates). */
static void index_str(const tensor *t, long long i, char *out, size_t cap)
{
    long long idx[MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = t->shape[d] ? i % t->shape[d] : 0;
        i = t->shape[d] ? i / t->shape[d] : 0;
    }
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < t->ndim && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", d ? ", " : "", idx[d]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* Compare one tensor of A with its namesake in B (B is the reference). Returns 1 if they differ. */
static int compare_tensor(const st_file *a, const tensor *ta, const st_file *b,
                          const tensor *tb, const options *o)
{
    char sa[128], sb[128], at[128];
    shape_str(ta, sa, sizeof sa);
    shape_str(tb, sb, sizeof sb);
    if (strcmp(sa, sb)) {
        printf("%-32s shape %s vs %s  DIFFERENT SHAPE\n", ta->name, sa, sb);
        return 1;
    }
    const unsigned char *da = a->bytes + a->data0 + ta->begin;
    const unsigned char *db = b->bytes + b->data0 + tb->begin;
    long long n = numel(ta), bad = 0;
    double max_abs = 0, max_rel = 0, atol = o->atol;
    if (o->atol_max > 0) {
        double scale = 0;
        for (long long i = 0; i < n; i++)
            scale = fmax(scale, fabs(element(db, (dtype)tb->dtype, (size_t)i)));
        atol += o->atol_max * scale;
    }
    for (long long i = 0; i < n; i++) {
        double x = element(da, (dtype)ta->dtype, (size_t)i);
        double y = element(db, (dtype)tb->dtype, (size_t)i);
        double d = fabs(x - y), r = y != 0 ? d / fabs(y) : (d != 0 ? INFINITY : 0);
        int same_nan = isnan(x) && isnan(y);
        int ok = same_nan || (o->exact ? x == y || (x == 0 && y == 0)
                                       : d <= atol + o->rtol * fabs(y));
        if (!same_nan) {
            if (!(d <= max_abs)) max_abs = d;          /* NaN propagates into the maximum */
            if (!(r <= max_rel)) max_rel = r;
        }
        if (!ok) {
            if (bad < o->show) {
                if (bad == 0)
                    printf("%-32s %s %s vs %s: first mismatches\n", ta->name, sa,
                           ta->dtype_name, tb->dtype_name);
                index_str(ta, i, at, sizeof at);
                printf("    %-14s %.9g vs %.9g  (abs %.3g, rel %.3g)\n", at, x, y, d, r);
            }
            bad++;
        }
    }
    if (bad)
        printf("%-32s %lld of %lld differ  max abs %.3g  max rel %.3g  MISMATCH\n", ta->name,
               bad, n, max_abs, max_rel);
    else if (!o->quiet)
        printf("%-32s %-14s max abs %.3g  max rel %.3g  ok\n", ta->name, sa, max_abs, max_rel);
    return bad > 0;
}

static int compare_files(const char *pa, const char *pb, const options *o)
{
    st_file a, b;
    if (st_open(&a, pa)) return 1;
    if (st_open(&b, pb)) { st_close(&a); return 1; }
    int ndiff = 0, ncmp = 0, unusable = 0;
    for (int i = 0; i < a.n; i++) unusable += !tensor_usable(&a, &a.t[i]);
    for (int i = 0; i < b.n; i++) unusable += !tensor_usable(&b, &b.t[i]);
    if (unusable) {
        st_close(&a);
        st_close(&b);
        return 1;
    }
    for (int i = 0; i < a.n; i++) {
        const tensor *tb = find(&b, a.t[i].name);
        if (!tb) {
            printf("%-32s only in %s\n", a.t[i].name, pa);
            ndiff++;
            continue;
        }
        ncmp++;
        ndiff += compare_tensor(&a, &a.t[i], &b, tb, o);
    }
    for (int i = 0; i < b.n; i++)
        if (!find(&a, b.t[i].name)) {
            printf("%-32s only in %s\n", b.t[i].name, pb);
            ndiff++;
        }
    if (o->exact)
        printf("%s: %d of %d tensors differ (exact)\n", progname, ndiff, ncmp);
    else if (o->atol_max > 0)
        printf("%s: %d of %d tensors differ (|a - b| <= %g + %g * max|b| + %g * |b|)\n",
               progname, ndiff, ncmp, o->atol, o->atol_max, o->rtol);
    else
        printf("%s: %d of %d tensors differ (|a - b| <= %g + %g * |b|)\n", progname, ndiff,
               ncmp, o->atol, o->rtol);
    st_close(&a);
    st_close(&b);
    return ndiff > 0;
}

/* -- Command line ---------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: %s [options] A.safetensors B.safetensors   compare (B is the reference)\n"
        "       %s --list FILE                             one line per tensor\n"
        "       %s --check [--dtype D] FILE                strict structure check\n"
        "  --atol X    absolute tolerance (default 1e-5)\n"
        "  --rtol X    relative tolerance (default 1e-5): |a - b| <= atol + rtol * |b|\n"
        "  --atol-max X  add X * max|b| of each tensor to atol (tolerance to its scale)\n"
        "  --exact     values must be equal (as numbers: F32 0.5 equals BF16 0.5)\n"
        "  --show N    mismatches printed per tensor (default 5)\n"
        "  -q          print only the tensors that differ and the summary\n"
        "Exit status: 0 same (or well formed), 1 different (or malformed), 2 usage error.\n",
        progname, progname, progname);
}

static double num_arg(const char *flag, const char *v)
{
    char *e;
    errno = 0;
    double d = strtod(v, &e);
    if (errno || e == v || *e || !(d >= 0)) {
        fprintf(stderr, "%s: error: %s expects a non-negative number, got '%s'\n", progname,
                flag, v);
        exit(2);
    }
    return d;
}

int main(int argc, char **argv)
{
    options o = { 1e-5, 1e-5, 0, 0, 5, 0 };
    const char *files[2];
    int nfiles = 0, list = 0, check = 0, want = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--list")) list = 1;
        else if (!strcmp(a, "--check")) check = 1;
        else if (!strcmp(a, "--exact")) o.exact = 1;
        else if (!strcmp(a, "-q")) o.quiet = 1;
        else if (!strcmp(a, "--atol") && has_value) o.atol = num_arg(a, argv[++i]);
        else if (!strcmp(a, "--rtol") && has_value) o.rtol = num_arg(a, argv[++i]);
        else if (!strcmp(a, "--atol-max") && has_value) o.atol_max = num_arg(a, argv[++i]);
        else if (!strcmp(a, "--show") && has_value) o.show = (int)num_arg(a, argv[++i]);
        else if (!strcmp(a, "--dtype") && has_value) {
            want = dtype_from_name(argv[++i]);
            if (want < 0) {
                fprintf(stderr, "%s: error: unknown dtype '%s'\n", progname, argv[i]);
                return 2;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "%s: error: unknown or incomplete option '%s' (try --help)\n",
                    progname, a);
            return 2;
        } else if (nfiles < 2) files[nfiles++] = a;
        else { usage(stderr); return 2; }
    }
    if (list + check > 1 || (want >= 0 && !check) || nfiles != (list || check ? 1 : 2)) {
        usage(stderr);
        return 2;
    }
    if (list) return list_file(files[0]);
    if (check) return check_file(files[0], want);
    return compare_files(files[0], files[1], &o);
}
