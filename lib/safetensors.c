/*
** safetensors.c: the safetensors reader and header writer of safetensors.h. The JSON parser
** reads exactly what safetensors headers hold (objects, arrays, strings with escapes, integers)
** and reports the first thing it cannot read with its byte position; it also reads the index
** JSON of sharded Hugging Face checkpoints. Used by the training library (--init, --save) and
** the tools; no MPI, no device, no model knowledge.
*/
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

static const struct { const char *name; int size; } dtypes[] = {
#define ST_DT_INFO(name, size) { #name, size },
    ST_DTYPES(ST_DT_INFO)
#undef ST_DT_INFO
};

int st_dtype_size(st_dtype t)
{
    return t < ST_UNKNOWN ? dtypes[t].size : 0;
}

const char *st_dtype_text(st_dtype t)
{
    return t < ST_UNKNOWN ? dtypes[t].name : "?";
}

/* The product of the shape; -1 when a dimension is negative or the product exceeds 2^60 (a
** corrupt header, found by tests/fuzz: st_extent_ok then fails). */
long long st_numel(const st_tensor *t)
{
    long long n = 1;
    for (int i = 0; i < t->ndim && i < ST_MAX_DIMS; i++) {
        long long d = t->shape[i];
        if (d < 0 || (d > 0 && n > (1ll << 60) / d)) return -1;
        n *= d;
    }
    return n;
}

int st_extent_ok(const st_file *f, const st_tensor *t)
{
    long long n = st_numel(t);
    if (n < 0) return 0;
    long long bytes = n * st_dtype_size(t->dtype);   /* < 2^63: n <= 2^60, sizes <= 8 */
    return t->begin >= 0 && t->end >= t->begin && t->end - t->begin == bytes &&
           t->end <= f->size - f->data;
}

/* -- JSON ------------------------------------------------------------------------------------ */

typedef struct {
    const char *p, *start, *end;
    const char *what;           /* first error, NULL while fine */
    const char *at;
} json;

static int j_fail(json *j, const char *what)
{
    if (!j->what) {
        j->what = what;
        j->at = j->p;
    }
    return 0;
}

static void j_ws(json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\r' || *j->p == '\n'))
        j->p++;
}

static int j_eat(json *j, char c)
{
    j_ws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    return 0;
}

/* A string into out[cap] (cut when longer); escapes \" \\ \/ \b \f \n \r \t and \uXXXX
** (code points below 0x80 kept, others as '?': names in model files are ASCII). */
static int j_str(json *j, char *out, size_t cap)
{
    size_t n = 0;
    if (!j_eat(j, '"')) return 0;
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if (c == '\\') {
            if (j->p >= j->end) return 0;
            c = *j->p++;
            switch (c) {
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'u': {
                unsigned v = 0;
                for (int k = 0; k < 4; k++) {
                    if (j->p >= j->end) return 0;
                    char h = *j->p++;
                    v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0' :
                                            h >= 'a' && h <= 'f' ? h - 'a' + 10 :
                                            h >= 'A' && h <= 'F' ? h - 'A' + 10 : 99);
                    if (v > 0xffff) return 0;
                }
                c = v < 0x80 ? (char)v : '?';
                break;
            }
            default: break;     /* \" \\ \/ */
            }
        }
        if (n + 1 < cap) out[n++] = c;
    }
    if (cap) out[n] = 0;
    return j_eat(j, '"');
}

static int j_int(json *j, long long *v)
{
    j_ws(j);
    char *end;
    errno = 0;
    *v = strtoll(j->p, &end, 10);
    if (end == j->p || errno) return 0;
    j->p = end;
    return 1;
}

/* Skip any JSON value (numbers in any form, true/false/null). */
static int j_skip(json *j, int depth)
{
    char tmp[8];
    j_ws(j);
    if (j->p >= j->end || depth > 64) return 0;
    char c = *j->p;
    if (c == '"') return j_str(j, tmp, sizeof tmp);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        if (j_eat(j, close)) return 1;
        do {
            if (close == '}' && (!j_str(j, tmp, sizeof tmp) || !j_eat(j, ':'))) return 0;
            if (!j_skip(j, depth + 1)) return 0;
        } while (j_eat(j, ','));
        return j_eat(j, close);
    }
    const char *s = j->p;
    while (j->p < j->end && strchr("+-.0123456789eEtruefalsn", *j->p)) j->p++;
    return j->p > s;
}

/* [n, n, ...] into out (at most max kept; *count gets the number read). */
static int j_ints(json *j, long long *out, int max, int *count)
{
    long long v;
    *count = 0;
    if (!j_eat(j, '[')) return j_fail(j, "expected '['");
    if (j_eat(j, ']')) return 1;
    do {
        if (!j_int(j, &v)) return 0;
        if (*count < max) out[*count] = v;
        ++*count;
    } while (j_eat(j, ','));
    return j_eat(j, ']') || j_fail(j, "expected ']'");
}

/* One tensor entry {"dtype": ..., "shape": [...], "data_offsets": [b, e]} into t. */
static int tensor_entry(json *j, st_tensor *t)
{
    char key[64];
    long long off[2] = { -1, -1 };
    int n;
    t->dtype = ST_UNKNOWN;
    t->dtype_name[0] = 0;
    t->ndim = 0;
    memset(t->keys, 0, sizeof t->keys);
    if (!j_eat(j, '{')) return j_fail(j, "expected a tensor entry");
    if (j_eat(j, '}')) return 1;
    do {
        if (!j_str(j, key, sizeof key) || !j_eat(j, ':')) return j_fail(j, "expected a key");
        int k = !strcmp(key, "dtype") ? ST_KEY_DTYPE : !strcmp(key, "shape") ? ST_KEY_SHAPE :
                !strcmp(key, "data_offsets") ? ST_KEY_OFFSETS : ST_KEY_OTHER;
        if (t->keys[k] < 255) t->keys[k]++;
        if (k == ST_KEY_DTYPE) {
            if (!j_str(j, t->dtype_name, sizeof t->dtype_name)) return j_fail(j, "bad dtype");
            for (int d = 0; d < ST_UNKNOWN; d++)
                if (!strcmp(dtypes[d].name, t->dtype_name)) t->dtype = (st_dtype)d;
        } else if (k == ST_KEY_SHAPE) {
            if (!j_ints(j, t->shape, ST_MAX_DIMS, &n)) return j_fail(j, "bad shape");
            t->ndim = n <= ST_MAX_DIMS ? n : ST_MAX_DIMS + 1;
        } else if (k == ST_KEY_OFFSETS) {
            if (!j_ints(j, off, 2, &n) || n != 2) return j_fail(j, "bad data_offsets");
        } else if (!j_skip(j, 0)) {
            return j_fail(j, "bad value");
        }
    } while (j_eat(j, ','));
    t->begin = off[0];
    t->end = off[1];
    return j_eat(j, '}') || j_fail(j, "expected '}'");
}

/* -- Reading ----------------------------------------------------------------------------------- */

static int fail(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

int st_open(st_file *f, const char *path, char *err, size_t cap)
{
    memset(f, 0, sizeof *f);
    f->fd = open(path, O_RDONLY);
    struct stat st;
    if (f->fd < 0 || fstat(f->fd, &st)) {
        int e = errno;
        if (f->fd >= 0) close(f->fd);
        f->fd = -1;
        return fail(err, cap, "cannot open: %s", strerror(e));
    }
    f->size = (long long)st.st_size;
    unsigned char len8[8];
    if (f->size < 8 || pread(f->fd, len8, 8, 0) != 8) {
        st_close(f);
        return fail(err, cap, "not a safetensors file (%lld bytes, shorter than its 8-byte "
                    "header length)", (long long)st.st_size);
    }
    unsigned long long hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    if (hlen > (unsigned long long)f->size - 8 || hlen > (unsigned long long)ST_HEADER_MAX) {
        long long size = f->size;
        st_close(f);
        return fail(err, cap, "not a safetensors file (header length %llu, file %lld bytes)",
                    hlen, size);
    }
    char *h = malloc(hlen + 1);
    if (!h) {
        st_close(f);
        return fail(err, cap, "out of memory for a %llu-byte header", hlen);
    }
    if (pread(f->fd, h, hlen, 8) != (ssize_t)hlen) {
        free(h);
        st_close(f);
        return fail(err, cap, "cannot read the header");
    }
    h[hlen] = 0;
    f->data = 8 + (long long)hlen;

    json j = { h, h, h + hlen, NULL, NULL };
    int capt = 0;
    if (!j_eat(&j, '{')) j_fail(&j, "not a JSON object");
    else if (!j_eat(&j, '}')) do {
        char name[ST_NAME_MAX];
        if (!j_str(&j, name, sizeof name) || !j_eat(&j, ':')) {
            j_fail(&j, "expected a name");
            break;
        }
        if (!strcmp(name, "__metadata__")) {
            if (!j_skip(&j, 0)) j_fail(&j, "bad value");
            if (j.what) break;
            continue;
        }
        if (f->n == capt) {
            capt = capt ? 2 * capt : 64;
            st_tensor *t = realloc(f->t, sizeof *t * (size_t)capt);
            if (!t) {
                free(h);
                st_close(f);
                return fail(err, cap, "out of memory for the header's tensors");
            }
            f->t = t;
        }
        st_tensor *t = &f->t[f->n++];
        memcpy(t->name, name, sizeof t->name);
        if (!tensor_entry(&j, t)) {
            j_fail(&j, "expected a tensor entry");
            break;
        }
    } while (j_eat(&j, ','));
    if (!j.what && !j_eat(&j, '}')) j_fail(&j, "expected ',' or '}'");
    if (j.what) {
        long at = (long)(j.at - h);
        const char *what = j.what;
        free(h);
        st_close(f);
        return fail(err, cap, "malformed safetensors header (%s, at byte %ld of the JSON)", what,
                    at);
    }
    free(h);
    return 0;
}

void st_close(st_file *f)
{
    if (f->fd >= 0) close(f->fd);
    free(f->t);
    f->t = NULL;
    f->n = 0;
    f->fd = -1;
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

float st_half_to_f32(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, u;
    if (e == 0) {                                   /* zero or subnormal: m * 2^-24 */
        float v = (float)m * 5.9604644775390625e-8f;
        return s ? -v : v;
    }
    if (e == 31) u = s | 0x7f800000u | m << 13;     /* inf or nan */
    else u = s | (e + 112) << 23 | m << 13;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static uint64_t le_bytes(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

double st_value(const unsigned char *data, st_dtype t, size_t i)
{
    int size = st_dtype_size(t);
    uint64_t u = le_bytes(data + i * (size_t)size, size);
    switch (t) {
    case ST_F64: { double d; memcpy(&d, &u, 8); return d; }
    case ST_F32: { uint32_t w = (uint32_t)u; float v; memcpy(&v, &w, 4); return v; }
    case ST_F16: return st_half_to_f32((uint16_t)u);
    case ST_BF16: { uint32_t w = (uint32_t)u << 16; float v; memcpy(&v, &w, 4); return v; }
    case ST_I64: return (double)(int64_t)u;
    case ST_I32: return (double)(int32_t)(uint32_t)u;
    case ST_I16: return (double)(int16_t)(uint16_t)u;
    case ST_I8: return (double)(int8_t)(uint8_t)u;
    case ST_U64: case ST_U32: case ST_U16: case ST_U8: return (double)u;
    case ST_BOOL: return u != 0;
    default: return 0.0;
    }
}

int st_read_f32(const st_file *f, const st_tensor *t, long long first, long long n, float *out)
{
    enum { CHUNK = 1 << 16 };
    int size = st_dtype_size(t->dtype);
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16) {
        errno = EINVAL;
        return -1;
    }
    unsigned char *raw = malloc((size_t)(n < CHUNK ? (n > 0 ? n : 1) : CHUNK) * (size_t)size);
    if (!raw) return -1;
    for (long long done = 0; done < n;) {
        long long k = n - done < CHUNK ? n - done : CHUNK;
        size_t bytes = (size_t)k * (size_t)size;
        off_t at = (off_t)(f->data + t->begin + (first + done) * size);
        ssize_t got = pread(f->fd, raw, bytes, at);
        if (got != (ssize_t)bytes) {
            if (got >= 0) errno = EIO;
            free(raw);
            return -1;
        }
        for (long long i = 0; i < k; i++)
            out[done + i] = (float)st_value(raw, t->dtype, (size_t)i);
        done += k;
    }
    free(raw);
    return 0;
}

/* -- Hugging Face checkpoints: the path, the index -------------------------------------------- */

static int is_regular(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* dir + "/" + name into out[cap] (no doubled '/'). */
static void join(char *out, size_t cap, const char *dir, size_t dirlen, const char *name)
{
    while (dirlen > 1 && dir[dirlen - 1] == '/') dirlen--;
    if (dirlen == 0) snprintf(out, cap, "%s", name);
    else snprintf(out, cap, "%.*s%s%s", (int)dirlen, dir, dir[dirlen - 1] == '/' ? "" : "/",
                  name);
}

int st_resolve(const char *path, char *out, size_t cap, int *is_index, char *err,
               size_t errcap)
{
    struct stat st;
    if (stat(path, &st)) return fail(err, errcap, "cannot open: %s", strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        size_t n = strlen(path);
        snprintf(out, cap, "%s", path);
        *is_index = n >= 5 && !strcmp(path + n - 5, ".json");
        return 0;
    }
    char index[ST_PATH_MAX], single[ST_PATH_MAX];
    join(index, sizeof index, path, strlen(path), ST_INDEX_NAME);
    join(single, sizeof single, path, strlen(path), ST_SINGLE_NAME);
    int has_index = is_regular(index), has_single = is_regular(single);
    if (has_index && has_single)
        return fail(err, errcap, "this directory holds both %s and %s: name the one to load",
                    ST_INDEX_NAME, ST_SINGLE_NAME);
    if (!has_index && !has_single)
        return fail(err, errcap, "no %s or %s in this directory (a Hugging Face checkpoint "
                    "directory holds one of them)", ST_INDEX_NAME, ST_SINGLE_NAME);
    snprintf(out, cap, "%s", has_index ? index : single);
    *is_index = has_index;
    return 0;
}

/* A string of fewer than ST_NAME_MAX bytes into out[ST_NAME_MAX]; longer ones are refused. */
static int j_name(json *j, char *out, const char *what)
{
    char buf[ST_NAME_MAX + 1];
    j_ws(j);
    const char *at = j->p;
    if (!j_str(j, buf, sizeof buf)) return j_fail(j, what);
    if (strlen(buf) >= ST_NAME_MAX) {
        j->p = at;
        return j_fail(j, "a name of 256 bytes or more");
    }
    memcpy(out, buf, strlen(buf) + 1);
    return 1;
}

static int by_name(const void *a, const void *b)
{
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x > y) - (x < y);      /* equal names: in file order */
}

/* The "weight_map" object into ix; entry k's position in the JSON into at[k]. */
static int weight_map(json *j, st_index *ix, long **at)
{
    int cap_map = 0, cap_shards = 0;
    char file[ST_NAME_MAX];
    if (!j_eat(j, '{')) return j_fail(j, "expected '{' after \"weight_map\":");
    if (j_eat(j, '}')) return 1;
    do {
        j_ws(j);
        long pos = (long)(j->p - j->start);
        if (ix->n == cap_map) {
            cap_map = cap_map ? 2 * cap_map : 256;
            st_entry *m = realloc(ix->map, sizeof *m * (size_t)cap_map);
            long *a = realloc(*at, sizeof *a * (size_t)cap_map);
            if (m) ix->map = m;
            if (a) *at = a;
            if (!m || !a) return j_fail(j, "out of memory");
        }
        st_entry *e = &ix->map[ix->n];
        if (!j_name(j, e->name, "expected a tensor name")) return 0;
        if (!j_eat(j, ':')) return j_fail(j, "expected ':'");
        if (!j_name(j, file, "expected a shard file name")) return 0;
        int k = 0;
        while (k < ix->nshards && strcmp(ix->shard[k], file)) k++;
        if (k == ix->nshards) {
            if (ix->nshards == cap_shards) {
                cap_shards = cap_shards ? 2 * cap_shards : 16;
                char (*s)[ST_NAME_MAX] = realloc(ix->shard, sizeof *s * (size_t)cap_shards);
                if (!s) return j_fail(j, "out of memory");
                ix->shard = s;
            }
            memcpy(ix->shard[ix->nshards++], file, sizeof file);
        }
        e->shard = k;
        (*at)[ix->n++] = pos;
    } while (j_eat(j, ','));
    return j_eat(j, '}') || j_fail(j, "expected ',' or '}'");
}

int st_index_read(st_index *ix, const char *path, char *err, size_t cap)
{
    memset(ix, 0, sizeof *ix);
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        int e = errno;
        if (fd >= 0) close(fd);
        return fail(err, cap, "cannot open: %s", strerror(e));
    }
    if ((long long)st.st_size > ST_INDEX_MAX) {
        close(fd);
        return fail(err, cap, "an index of %lld bytes (at most %lld are read): not an index?",
                    (long long)st.st_size, ST_INDEX_MAX);
    }
    size_t size = (size_t)st.st_size;
    char *text = malloc(size + 1);
    if (!text) {
        close(fd);
        return fail(err, cap, "out of memory for a %zu-byte index", size);
    }
    ssize_t got = pread(fd, text, size, 0);
    close(fd);
    if (got != (ssize_t)size) {
        free(text);
        return fail(err, cap, "cannot read: %s", got < 0 ? strerror(errno) : "short read");
    }
    text[size] = 0;

    json j = { text, text, text + size, NULL, NULL };
    long *at = NULL;
    int maps = 0;
    if (!j_eat(&j, '{')) j_fail(&j, "not a JSON object");
    else if (!j_eat(&j, '}')) do {
        char key[64];
        if (!j_str(&j, key, sizeof key) || !j_eat(&j, ':')) {
            j_fail(&j, "expected a key");
            break;
        }
        if (!strcmp(key, "weight_map")) {
            if (maps++) {
                j_fail(&j, "a second \"weight_map\"");
                break;
            }
            if (!weight_map(&j, ix, &at)) break;
        } else if (!j_skip(&j, 0)) {
            j_fail(&j, "bad value");
            break;
        }
    } while (j_eat(&j, ','));
    if (!j.what && !j_eat(&j, '}')) j_fail(&j, "expected ',' or '}'");
    j_ws(&j);
    if (!j.what && j.p < j.end) j_fail(&j, "text after the JSON object");
    if (!j.what && !maps) j_fail(&j, "no \"weight_map\" object");
    if (!j.what && ix->n) {
        ix->byname = malloc(sizeof *ix->byname * (size_t)ix->n);
        if (!ix->byname) j_fail(&j, "out of memory");
    }
    if (!j.what) {
        for (int k = 0; k < ix->n; k++) ix->byname[k] = &ix->map[k];
        if (ix->n)   /* an empty weight_map: byname is NULL, which qsort may not get */
            qsort(ix->byname, (size_t)ix->n, sizeof *ix->byname, by_name);
        for (int k = 1; k < ix->n; k++)
            if (!strcmp(ix->byname[k - 1]->name, ix->byname[k]->name)) {
                const st_entry *e = ix->byname[k];
                long pos = at[e - ix->map];
                free(at);
                free(text);
                return fail(err, cap, "malformed index JSON (tensor '%s' mapped twice, at byte "
                            "%ld)", e->name, pos);
            }
    }
    free(at);
    if (j.what) {
        long pos = (long)(j.at - text);
        free(text);
        return fail(err, cap, "malformed index JSON (%s, at byte %ld)", j.what, pos);
    }
    free(text);
    return 0;
}

void st_index_free(st_index *ix)
{
    free(ix->map);
    free(ix->byname);
    free(ix->shard);
    memset(ix, 0, sizeof *ix);
}

const st_entry *st_index_find(const st_index *ix, const char *name)
{
    int lo = 0, hi = ix->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(ix->byname[mid]->name, name);
        if (c == 0) return ix->byname[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

void st_index_shard_path(const st_index *ix, int k, const char *index_path, char *out,
                         size_t cap)
{
    const char *slash = strrchr(index_path, '/');
    if (ix->shard[k][0] == '/') snprintf(out, cap, "%s", ix->shard[k]);
    else join(out, cap, index_path, slash ? (size_t)(slash - index_path + 1) : 0, ix->shard[k]);
}

/* -- Writing ----------------------------------------------------------------------------------- */

unsigned char *st_header(st_tensor *t, int n, size_t *len)
{
    size_t cap = 64, used = 8;
    for (int i = 0; i < n; i++) cap += strlen(t[i].name) + 64 + 24 * (size_t)(t[i].ndim + 2);
    unsigned char *h = malloc(cap + 8 + 8);
    if (!h) return NULL;
    char *p = (char *)h;
    used += (size_t)snprintf(p + used, cap + 8 - used, "{\"__metadata__\":{\"format\":\"pt\"}");
    long long off = 0;
    for (int i = 0; i < n; i++) {
        long long bytes = st_numel(&t[i]) * st_dtype_size(t[i].dtype);
        t[i].begin = off;
        t[i].end = off + bytes;
        off += bytes;
        used += (size_t)snprintf(p + used, cap + 8 - used, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                 t[i].name, st_dtype_text(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++)
            used += (size_t)snprintf(p + used, cap + 8 - used, "%s%lld", d ? "," : "",
                                     t[i].shape[d]);
        used += (size_t)snprintf(p + used, cap + 8 - used, "],\"data_offsets\":[%lld,%lld]}",
                                 t[i].begin, t[i].end);
    }
    p[used++] = '}';
    while (used % 8) p[used++] = ' ';
    uint64_t hlen = used - 8;
    for (int i = 0; i < 8; i++) h[i] = (unsigned char)(hlen >> (8 * i));
    *len = used;
    return h;
}
