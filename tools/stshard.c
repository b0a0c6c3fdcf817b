/*
** stshard: rewrite a safetensors file as Hugging Face's save_pretrained lays out a checkpoint:
** N shards model-0000k-of-0000N.safetensors plus model.safetensors.index.json, or one
** model.safetensors; optionally cast to BF16 or F32 and with tensors renamed. A user tool
** (publishing a trained model, trying --init on sharded input) and the fixture maker of
** tests/hfload. It reads with the training library's reader (lib/safetensors.c).
**
**   stshard [--shards N] [--dtype F32|BF16] [--prefix P] [--rename OLD=NEW]... IN OUTDIR
**
** Tensors keep their order; shard k holds the next run of them, about 1/N of the bytes each.
** The index is {"metadata": {"total_size": bytes}, "weight_map": {name: shard}}, names sorted,
** indented by 2 (as transformers writes it). --prefix P prepends P to each name not renamed.
** Exit: 0 written, 1 an error (IN unreadable, a dtype that cannot be cast), 2 usage error.
*/
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"   // defines: st_open, st_read_f32, st_header, st_file, ST_INDEX_NAME

static const char *progname = "stshard";

#define MAX_RENAMES 64

static void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void die(int code, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: error: ", progname);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(code);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: %s [--shards N] [--dtype F32|BF16] [--prefix P] [--rename OLD=NEW]... "
            "IN OUTDIR\n", progname);
}

/* F32 bits to BF16 bits, rounded to nearest even; a NaN stays a (quiet) NaN. */
static uint16_t to_bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40);
    return (uint16_t)((u + 0x7fffu + (u >> 16 & 1)) >> 16);
}

/* Tensor t of 'in' as bytes of dtype 'to' (ST_UNKNOWN: as stored) into a malloc'd buffer. */
static unsigned char *tensor_bytes(const st_file *in, const st_tensor *t, st_dtype to,
                                   size_t *len)
{
    long long n = st_numel(t);
    if (to == ST_UNKNOWN) {
        *len = (size_t)(t->end - t->begin);
        unsigned char *b = malloc(*len ? *len : 1);
        if (!b) die(1, "out of memory");
        if (pread(in->fd, b, *len, (off_t)(in->data + t->begin)) != (ssize_t)*len)
            die(1, "cannot read tensor '%s': %s", t->name, strerror(errno ? errno : EIO));
        return b;
    }
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) die(1, "out of memory");
    if (st_read_f32(in, t, 0, n, v))
        die(1, "cannot read tensor '%s' (%s) as numbers: %s", t->name, t->dtype_name,
            strerror(errno));
    *len = (size_t)n * (size_t)st_dtype_size(to);
    unsigned char *b = malloc(*len ? *len : 1);
    if (!b) die(1, "out of memory");
    for (long long i = 0; i < n; i++) {
        if (to == ST_F32) {
            memcpy(b + 4 * i, &v[i], 4);     /* little-endian hosts only, as the library */
        } else {
            uint16_t h = to_bf16(v[i]);
            b[2 * i] = (unsigned char)h;
            b[2 * i + 1] = (unsigned char)(h >> 8);
        }
    }
    free(v);
    return b;
}

/* Write shard 'path' holding tensors [a, b) of 'in' (names and dtypes as in out[]). */
static void write_shard(const char *path, const st_file *in, st_tensor *out, int a, int b,
                        st_dtype to)
{
    size_t hlen;
    unsigned char *h = st_header(out + a, b - a, &hlen);
    if (!h) die(1, "out of memory");
    FILE *f = fopen(path, "wb");
    if (!f) die(1, "cannot create %s: %s", path, strerror(errno));
    int ok = fwrite(h, 1, hlen, f) == hlen;
    for (int i = a; i < b && ok; i++) {
        size_t len;
        unsigned char *bytes = tensor_bytes(in, &in->t[i], to, &len);
        ok = fwrite(bytes, 1, len, f) == len;
        free(bytes);
    }
    if (fclose(f) || !ok) die(1, "cannot write %s: %s", path, strerror(errno));
    free(h);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

/* A JSON string, escaped. */
static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", (unsigned char)*s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

int main(int argc, char **argv)
{
    int shards = 1, nren = 0;
    const char *prefix = "", *dtype = NULL, *ren[MAX_RENAMES], *in_path = NULL, *dir = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        int has_value = i + 1 < argc;
        if (!strcmp(a, "--shards") && has_value) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 99999) die(2, "--shards expects 1 to 99999");
            shards = (int)n;
        } else if (!strcmp(a, "--dtype") && has_value) {
            dtype = argv[++i];
        } else if (!strcmp(a, "--prefix") && has_value) {
            prefix = argv[++i];
        } else if (!strcmp(a, "--rename") && has_value) {
            if (nren == MAX_RENAMES) die(2, "at most %d --rename", MAX_RENAMES);
            ren[nren++] = argv[++i];
            if (!strchr(ren[nren - 1], '=')) die(2, "--rename expects OLD=NEW");
        } else if (a[0] == '-' && a[1]) {
            usage(stderr);
            return 2;
        } else if (!in_path) {
            in_path = a;
        } else if (!dir) {
            dir = a;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!dir) {
        usage(stderr);
        return 2;
    }
    st_dtype to = ST_UNKNOWN;
    if (dtype && !strcmp(dtype, "F32")) to = ST_F32;
    else if (dtype && !strcmp(dtype, "BF16")) to = ST_BF16;
    else if (dtype) die(2, "--dtype is F32 or BF16, not '%s'", dtype);

    char err[256], path[ST_PATH_MAX];
    st_file in;
    if (st_open(&in, in_path, err, sizeof err)) die(1, "%s: %s", in_path, err);
    if (in.n < shards) die(1, "%s: %d tensors cannot fill %d shards", in_path, in.n, shards);
    st_tensor *out = calloc((size_t)in.n, sizeof *out);
    if (!out) die(1, "out of memory");
    long long total = 0;
    for (int i = 0; i < in.n; i++) {
        const st_tensor *t = &in.t[i];
        if (!st_extent_ok(&in, t)) die(1, "%s: tensor '%s' lies outside the file", in_path,
                                         t->name);
        out[i] = *t;
        if (to != ST_UNKNOWN) out[i].dtype = to;
        const char *name = NULL;
        for (int r = 0; r < nren; r++) {
            size_t n = (size_t)(strchr(ren[r], '=') - ren[r]);
            if (strlen(t->name) == n && !strncmp(t->name, ren[r], n)) name = ren[r] + n + 1;
        }
        int len = name ? snprintf(out[i].name, sizeof out[i].name, "%s", name)
                       : snprintf(out[i].name, sizeof out[i].name, "%s%s", prefix, t->name);
        if (len >= (int)sizeof out[i].name) die(1, "the new name of '%s' is too long", t->name);
        total += st_numel(&out[i]) * st_dtype_size(out[i].dtype);
    }
    if (mkdir(dir, 0755) && errno != EEXIST) die(1, "cannot create %s: %s", dir,
                                                  strerror(errno));
    if (shards == 1) {
        snprintf(path, sizeof path, "%s/%s", dir, ST_SINGLE_NAME);
        write_shard(path, &in, out, 0, in.n, to);
        st_close(&in);
        free(out);
        return 0;
    }
    /* shard k ends after the tensor that reaches (k+1)/N of the bytes, leaving one per shard */
    int *shard_of = malloc(sizeof *shard_of * (size_t)in.n);
    if (!shard_of) die(1, "out of memory");
    long long done = 0;
    for (int i = 0, k = 0, first = 0; i < in.n; i++) {
        done += st_numel(&out[i]) * st_dtype_size(out[i].dtype);
        shard_of[i] = k;
        int last = i == in.n - 1 || (k < shards - 1 &&
                   (done * shards >= total * (k + 1) || in.n - 1 - i == shards - 1 - k));
        if (!last) continue;
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, k + 1, shards);
        write_shard(path, &in, out, first, i + 1, to);
        first = i + 1;
        k++;
    }
    st_tensor *sorted = malloc(sizeof *sorted * (size_t)in.n);
    if (!sorted) die(1, "out of memory");
    for (int i = 0; i < in.n; i++) {
        sorted[i] = out[i];
        sorted[i].begin = shard_of[i];      /* the shard, carried through the sort */
    }
    qsort(sorted, (size_t)in.n, sizeof *sorted, by_name);
    snprintf(path, sizeof path, "%s/%s", dir, ST_INDEX_NAME);
    FILE *f = fopen(path, "w");
    if (!f) die(1, "cannot create %s: %s", path, strerror(errno));
    fprintf(f, "{\n  \"metadata\": {\n    \"total_size\": %lld\n  },\n  \"weight_map\": {\n",
            total);
    for (int i = 0; i < in.n; i++) {
        fprintf(f, "    ");
        put_string(f, sorted[i].name);
        fprintf(f, ": \"model-%05d-of-%05d.safetensors\"%s\n", (int)sorted[i].begin + 1, shards,
                i + 1 < in.n ? "," : "");
    }
    fprintf(f, "  }\n}\n");
    if (fclose(f)) die(1, "cannot write %s: %s", path, strerror(errno));
    st_close(&in);
    free(sorted);
    free(shard_of);
    free(out);
    return 0;
}
