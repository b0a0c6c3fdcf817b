/*
** stcompare: compare two safetensors files tensor by tensor, list a file's tensors, or check
** that a file is well formed. A user tool (checkpoints of the generated training programs,
** the reference's and Hugging Face's) and the one safetensors comparer of the tests. It reads
** files with the training library's reader (lib/safetensors.c). Comparison is numeric in
** double: F64, F32, F16, BF16 and the integer dtypes; B is the reference.
**
**   stcompare [--atol X] [--rtol X] [--atol-max X] [--outliers F --hard X] [--exact]
**             [--show N] [-q] A B
**   stcompare --list FILE                    name, dtype, shape, data offsets per tensor
**   stcompare --check [--dtype D] FILE       strict structure check (see check_file)
**
** An element is close when |a - b| <= atol + rtol * |b| (plus atol_max * max|b| over its
** tensor's finite values); equal values, infinities included, are always close.
** With --outliers F, a fraction F of all the elements may be farther (outliers) as long as each
** stays within hard + rtol * |b|. The last line sums up: tensors that differ, elements,
** outliers, the largest difference and where.
**
** Exit: 0 same / well formed, 1 a difference or a malformed file, 2 usage error.
*/
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "safetensors.h"   // defines: st_open, st_file, st_tensor, st_value, ST_KEY_*

static const char *progname = "stcompare";

#define MAX_ERRORS 20       /* --check reports at most this many problems */

/* -- A file: the library's header, the data mapped, problems counted ---------------------- */

typedef struct {
    const char *path;
    st_file st;
    const unsigned char *bytes;     /* the whole file, mapped (NULL when empty) */
    int nerrors;                    /* problems found (all counted, MAX_ERRORS reported) */
} file;

static void file_error(file *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void file_error(file *f, const char *fmt, ...)
{
    va_list ap;
    if (f->nerrors++ >= MAX_ERRORS) return;
    fprintf(stderr, "%s: error: ", f->path);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* Open and map 'path'. Returns 0, or -1 after reporting (then nothing to close). */
static int file_open(file *f, const char *path)
{
    char err[256];
    memset(f, 0, sizeof *f);
    f->path = path;
    if (st_open(&f->st, path, err, sizeof err)) {
        fprintf(stderr, "%s: error: %s\n", path, err);
        return -1;
    }
    void *m = mmap(NULL, (size_t)f->st.size, PROT_READ, MAP_PRIVATE, f->st.fd, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "%s: error: cannot map: %s\n", path, strerror(errno));
        st_close(&f->st);
        return -1;
    }
    f->bytes = m;
    return 0;
}

static void file_close(file *f)
{
    munmap((void *)f->bytes, (size_t)f->st.size);
    st_close(&f->st);
}

static long long data_bytes(const file *f)
{
    return f->st.size - f->st.data;
}

static void shape_str(const st_tensor *t, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < t->ndim && d < ST_MAX_DIMS && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", d ? ", " : "", t->shape[d]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* Problems that make a tensor's data unreadable (reported by every mode). */
static int tensor_usable(file *f, const st_tensor *t)
{
    if (t->keys[ST_KEY_DTYPE] != 1 || t->keys[ST_KEY_SHAPE] != 1 ||
        t->keys[ST_KEY_OFFSETS] != 1) {
        file_error(f, "tensor '%s' needs exactly one each of dtype, shape and data_offsets",
                   t->name);
        return 0;
    }
    if (t->dtype == ST_UNKNOWN) {
        file_error(f, "tensor '%s' has unknown dtype '%s'", t->name, t->dtype_name);
        return 0;
    }
    if (t->ndim > ST_MAX_DIMS) {
        file_error(f, "tensor '%s' has more than %d dimensions", t->name, ST_MAX_DIMS);
        return 0;
    }
    if (st_numel(t) < 0) {
        file_error(f, "tensor '%s' has an impossible shape (a negative dimension, or more "
                   "than 2^60 elements)", t->name);
        return 0;
    }
    if (t->begin > t->end || !st_extent_ok(&f->st, t)) {
        file_error(f, "tensor '%s' has data_offsets [%lld, %lld] but needs %lld bytes within "
                   "the %lld-byte data section", t->name, t->begin, t->end,
                   st_numel(t) * st_dtype_size(t->dtype), data_bytes(f));
        return 0;
    }
    return 1;
}

/* -- --list and --check ------------------------------------------------------------------------ */

static int list_file(const char *path)
{
    file f;
    char shape[128];
    if (file_open(&f, path)) return 1;
    for (int i = 0; i < f.st.n; i++) {
        const st_tensor *t = &f.st.t[i];
        shape_str(t, shape, sizeof shape);
        printf("%s %s %s %lld %lld\n", t->name, t->dtype_name, shape, t->begin, t->end);
    }
    file_close(&f);
    return 0;
}

/*
** The strict check: the header length is a multiple of 8 (so the data section is 8-byte
** aligned), the JSON is one object whose entries each have exactly dtype, shape and
** data_offsets; names are unique; the tensors, in header order, tile the data section from 0
** to the end of the file without gaps or overlaps; each spans numel * dtype size bytes; with
** 'want' != ST_UNKNOWN every tensor has that dtype. Reports every problem (capped) and returns
** 1 if any.
*/
static int check_file(const char *path, st_dtype want)
{
    file f;
    if (file_open(&f, path)) return 1;
    if (f.st.data % 8)
        file_error(&f, "header length %lld is not a multiple of 8 (data section not 8-byte "
                   "aligned)", f.st.data - 8);
    long long at = 0;
    for (int i = 0; i < f.st.n; i++) {
        const st_tensor *t = &f.st.t[i];
        for (int k = 0; k < i; k++)
            if (!strcmp(f.st.t[k].name, t->name))
                file_error(&f, "tensor '%s' appears twice", t->name);
        if (t->keys[ST_KEY_OTHER])
            file_error(&f, "tensor '%s' has keys other than dtype, shape and data_offsets",
                       t->name);
        if (!tensor_usable(&f, t)) continue;
        if (want != ST_UNKNOWN && t->dtype != want)
            file_error(&f, "tensor '%s' is %s, expected %s", t->name, t->dtype_name,
                       st_dtype_text(want));
        if (t->begin != at)
            file_error(&f, "tensor '%s' starts at %lld, expected %lld (gap or overlap)",
                       t->name, t->begin, at);
        at = t->end;
    }
    if (at != data_bytes(&f))
        file_error(&f, "tensors end at %lld but the data section has %lld bytes", at,
                   data_bytes(&f));
    int bad = f.nerrors > 0;
    if (f.nerrors > MAX_ERRORS)
        fprintf(stderr, "%s: %d more problems not shown\n", path, f.nerrors - MAX_ERRORS);
    if (!bad) printf("%s: ok (%d tensors, header %lld bytes)\n", path, f.st.n, f.st.data - 8);
    file_close(&f);
    return bad;
}

/* -- Comparison ------------------------------------------------------------------------------- */

typedef struct {
    double atol, rtol;
    double atol_max;            /* plus atol_max * max|b| of each tensor */
    double outliers, hard;      /* a fraction of elements may be off by up to hard + rtol|b| */
    int exact, show, quiet;
} options;

/* What a comparison found, over all tensors. */
typedef struct {
    long long elements, outliers, mismatches;
    double max_abs;
    char worst[ST_NAME_MAX];    /* the tensor of max_abs */
} tally;

/* Index i of a tensor as "[r, c]" (row-major coordinates). */
static void index_str(const st_tensor *t, long long i, char *out, size_t cap)
{
    long long idx[ST_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = t->shape[d] ? i % t->shape[d] : 0;
        i = t->shape[d] ? i / t->shape[d] : 0;
    }
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < t->ndim && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", d ? ", " : "", idx[d]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* Compare one tensor of A with its namesake in B. Returns 1 if they differ. */
static int compare_tensor(const file *a, const st_tensor *ta, const file *b,
                          const st_tensor *tb, const options *o, tally *s)
{
    char sa[128], sb[128], at[128];
    shape_str(ta, sa, sizeof sa);
    shape_str(tb, sb, sizeof sb);
    if (strcmp(sa, sb)) {
        printf("%-32s shape %s vs %s  DIFFERENT SHAPE\n", ta->name, sa, sb);
        return 1;
    }
    const unsigned char *da = a->bytes + a->st.data + ta->begin;
    const unsigned char *db = b->bytes + b->st.data + tb->begin;
    long long n = st_numel(ta), bad = 0, far = 0;
    double max_abs = 0, max_rel = 0, atol = o->atol;
    if (o->atol_max > 0) {
        double scale = 0;
        for (long long i = 0; i < n; i++) {         /* the finite values' scale */
            double y = fabs(st_value(db, tb->dtype, (size_t)i));
            if (isfinite(y)) scale = fmax(scale, y);
        }
        atol += o->atol_max * scale;
    }
    for (long long i = 0; i < n; i++) {
        double x = st_value(da, ta->dtype, (size_t)i);
        double y = st_value(db, tb->dtype, (size_t)i);
        /* equal values (infinities too) differ by 0, never by inf - inf = NaN */
        double d = x == y ? 0.0 : fabs(x - y);
        double r = y != 0 ? d / fabs(y) : (d != 0 ? INFINITY : 0);
        int same_nan = isnan(x) && isnan(y);
        int close = same_nan || (o->exact ? x == y || (x == 0 && y == 0)
                                          : d <= atol + o->rtol * fabs(y));
        int ok = close || (!o->exact && o->outliers > 0 && d <= o->hard + o->rtol * fabs(y));
        if (!same_nan) {
            if (!(d <= max_abs)) max_abs = d;          /* NaN propagates into the maximum */
            if (!(r <= max_rel)) max_rel = r;
        }
        far += !close && ok;
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
    s->elements += n;
    s->outliers += far;
    s->mismatches += bad;
    if (!(max_abs <= s->max_abs)) {
        s->max_abs = max_abs;
        snprintf(s->worst, sizeof s->worst, "%s", ta->name);
    }
    if (bad)
        printf("%-32s %lld of %lld differ  max abs %.3g  max rel %.3g  MISMATCH\n", ta->name,
               bad, n, max_abs, max_rel);
    else if (!o->quiet)
        printf("%-32s %-14s max abs %.3g  max rel %.3g%s  ok\n", ta->name, sa, max_abs, max_rel,
               far ? "  (outliers)" : "");
    return bad > 0;
}

static int compare_files(const char *pa, const char *pb, const options *o)
{
    file a, b;
    if (file_open(&a, pa)) return 1;
    if (file_open(&b, pb)) { file_close(&a); return 1; }
    int ndiff = 0, ncmp = 0, unusable = 0;
    for (int i = 0; i < a.st.n; i++) unusable += !tensor_usable(&a, &a.st.t[i]);
    for (int i = 0; i < b.st.n; i++) unusable += !tensor_usable(&b, &b.st.t[i]);
    if (unusable) {
        file_close(&a);
        file_close(&b);
        return 1;
    }
    tally s = { 0, 0, 0, 0, "-" };
    for (int i = 0; i < a.st.n; i++) {
        const st_tensor *tb = st_find(&b.st, a.st.t[i].name);
        if (!tb) {
            printf("%-32s only in %s\n", a.st.t[i].name, pa);
            ndiff++;
            continue;
        }
        ncmp++;
        ndiff += compare_tensor(&a, &a.st.t[i], &b, tb, o, &s);
    }
    for (int i = 0; i < b.st.n; i++)
        if (!st_find(&a.st, b.st.t[i].name)) {
            printf("%-32s only in %s\n", b.st.t[i].name, pb);
            ndiff++;
        }
    double allowed = floor(o->outliers * (double)s.elements);
    int too_many = (double)s.outliers > allowed;
    printf("%s: %d of %d tensors differ", progname, ndiff, ncmp);
    if (o->exact)
        printf(" (exact)");
    else if (o->atol_max > 0)
        printf(" (|a - b| <= %g + %g * max|b| + %g * |b|)", o->atol, o->atol_max, o->rtol);
    else
        printf(" (|a - b| <= %g + %g * |b|)", o->atol, o->rtol);
    printf("; %lld elements", s.elements);
    if (o->outliers > 0 && !o->exact)
        printf(", %lld outliers (allowed %.0f, each within %g + %g * |b|)%s", s.outliers,
               allowed, o->hard, o->rtol, too_many ? " TOO MANY" : "");
    printf(", max abs diff %.3g (%s)\n", s.max_abs, s.worst);
    file_close(&a);
    file_close(&b);
    return ndiff > 0 || too_many;
}

/* -- Command line ---------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: %s [options] A.safetensors B.safetensors   compare (B is the reference)\n"
        "       %s --list FILE                             one line per tensor\n"
        "       %s --check [--dtype D] FILE                strict structure check\n"
        "  --atol X      absolute tolerance (default 1e-5)\n"
        "  --rtol X      relative tolerance (default 1e-5): |a - b| <= atol + rtol * |b|\n"
        "  --atol-max X  add X * max|b| of each tensor to atol (tolerance to its scale)\n"
        "  --outliers F  let a fraction F of all elements be outside atol + rtol * |b| ...\n"
        "  --hard X      ... as long as each is within X + rtol * |b| (needs --outliers)\n"
        "  --exact       values must be equal (as numbers: F32 0.5 equals BF16 0.5)\n"
        "  --show N      mismatches printed per tensor (default 5)\n"
        "  -q            print only the tensors that differ and the summary\n"
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

static st_dtype dtype_arg(const char *v)
{
    for (int d = 0; d < ST_UNKNOWN; d++)
        if (!strcmp(st_dtype_text((st_dtype)d), v)) return (st_dtype)d;
    fprintf(stderr, "%s: error: unknown dtype '%s'\n", progname, v);
    exit(2);
}

int main(int argc, char **argv)
{
    options o = { 1e-5, 1e-5, 0, 0, -1, 0, 5, 0 };
    const char *files[2];
    int nfiles = 0, list = 0, check = 0;
    st_dtype want = ST_UNKNOWN;
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
        else if (!strcmp(a, "--outliers") && has_value) o.outliers = num_arg(a, argv[++i]);
        else if (!strcmp(a, "--hard") && has_value) o.hard = num_arg(a, argv[++i]);
        else if (!strcmp(a, "--show") && has_value) o.show = (int)num_arg(a, argv[++i]);
        else if (!strcmp(a, "--dtype") && has_value) want = dtype_arg(argv[++i]);
        else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "%s: error: unknown or incomplete option '%s' (try --help)\n",
                    progname, a);
            return 2;
        } else if (nfiles < 2) files[nfiles++] = a;
        else { usage(stderr); return 2; }
    }
    if (list + check > 1 || (want != ST_UNKNOWN && !check) ||
        nfiles != (list || check ? 1 : 2)) {
        usage(stderr);
        return 2;
    }
    if ((o.outliers > 0) != (o.hard >= 0)) {
        fprintf(stderr, "%s: error: --outliers and --hard go together\n", progname);
        return 2;
    }
    if (list) return list_file(files[0]);
    if (check) return check_file(files[0], want);
    return compare_files(files[0], files[1], &o);
}
