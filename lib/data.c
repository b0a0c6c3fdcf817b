/*
** data.c: Megatron-LM's indexed datasets (PREFIX.bin + PREFIX.idx, as its
** tools/preprocess_data.py writes them), sampled as Megatron's GPTDataset and BlendedDataset
** sample the "train" split of the whole corpus: the document index shuffled over epochs, the
** sample index of build_sample_idx, the shuffle index (all from NumPy's legacy RandomState,
** reproduced here), and for blends the blending indices of build_blending_indices.
** Also the nanoGPT / llm.c token files (lib_tokens_open), and, at the end, what a run trains
** on: the data the flags name and the token ids of each step's micro-batches (lib_tokens_*).
** Called by gpt_main at start-up and for each step. Every rank builds the same indices; a bad
** file is reported once, by rank 0, through lib_fail_file. Files are read as little-endian, as
** on the hosts that write them. Calls only the runtime and fail.c (tests/fuzz includes it).
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "data.h"
#include "fail.h"     // defines: lib_fail_file, lib_fail_all

/* -- NumPy's legacy RandomState: MT19937 and shuffle ---------------------------------------- */

enum { MT_N = 624, MT_M = 397 };

typedef struct {
    uint32_t key[MT_N];
    int pos;
} mt19937;

/* RandomState(seed) for an integer seed in [0, 2^32): Matsumoto and Nishimura's init_genrand. */
static void mt_seed(mt19937 *mt, uint32_t seed)
{
    for (int i = 0; i < MT_N; i++) {
        mt->key[i] = seed;
        seed = 1812433253u * (seed ^ (seed >> 30)) + (uint32_t)i + 1u;
    }
    mt->pos = MT_N;
}

static uint32_t mt_next32(mt19937 *mt)
{
    if (mt->pos == MT_N) {                  /* the next 624 words */
        uint32_t *k = mt->key;
        for (int i = 0; i < MT_N; i++) {
            uint32_t y = (k[i] & 0x80000000u) | (k[(i + 1) % MT_N] & 0x7fffffffu);
            k[i] = k[(i + MT_M) % MT_N] ^ (y >> 1) ^ (y & 1u ? 0x9908b0dfu : 0u);
        }
        mt->pos = 0;
    }
    uint32_t y = mt->key[mt->pos++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

/* A uniform integer in [0, max] as NumPy's random_interval draws it: masked draws, rejected
** above max; 32-bit words while max fits in 32 bits, else (high << 32 | low) pairs. */
static uint64_t mt_interval(mt19937 *mt, uint64_t max)
{
    if (max == 0) return 0;
    uint64_t mask = max, v;
    for (int s = 1; s <= 32; s <<= 1) mask |= mask >> s;
    if (max <= 0xffffffffu) {
        while ((v = mt_next32(mt) & mask) > max) {}
    } else {
        do {
            uint64_t hi = mt_next32(mt);
            v = (hi << 32 | mt_next32(mt)) & mask;
        } while (v > max);
    }
    return v;
}

/* RandomState.shuffle of a 1-D array of n elements of es bytes (int32 or int64): for i = n-1
** down to 1, swap a[i] with a[interval(i)]. */
static void mt_shuffle(mt19937 *mt, void *a, size_t es, long long n)
{
    unsigned char *b = a, t[8];
    for (long long i = n - 1; i > 0; i--) {
        long long j = (long long)mt_interval(mt, (uint64_t)i);
        memcpy(t, b + (size_t)i * es, es);
        memcpy(b + (size_t)i * es, b + (size_t)j * es, es);
        memcpy(b + (size_t)j * es, t, es);
    }
}

/* -- One indexed dataset --------------------------------------------------------------------- */

/* Megatron's DType codes (indexed_dataset.py): code, name, bytes; float types hold no ids. */
#define MM_DTYPES(_) _(1, "uint8", 1) _(2, "int8", 1) _(3, "int16", 2) _(4, "int32", 4) \
    _(5, "int64", 8) _(6, "float64", 8) _(7, "float32", 4) _(8, "uint16", 2)
#define MM_NAME(code, name, bytes) [code] = name,
#define MM_BYTES(code, name, bytes) [code] = bytes,
static const char *const mm_dtype_name[] = { MM_DTYPES(MM_NAME) };
static const int mm_dtype_bytes[] = { MM_DTYPES(MM_BYTES) };
enum { MM_NCODES = sizeof mm_dtype_bytes / sizeof mm_dtype_bytes[0] };

static const char MM_MAGIC[9] = "MMIDIDX\0";     /* 9 bytes: "MMIDIDX\x00\x00" */
enum { MM_HEADER = 9 + 8 + 1 + 8 + 8 };           /* magic, version, dtype, counts */

typedef struct {
    char *bin, *idx;            /* PREFIX.bin, PREFIX.idx */
    int fd;                     /* PREFIX.bin */
    int code, width;            /* dtype code, bytes per token */
    long long nseq, ntok;       /* sequences ("documents" to GPTDataset), their tokens */
    int32_t *len;               /* (nseq) tokens of each sequence */
    int64_t *ptr;               /* (nseq) byte offset of each in PREFIX.bin */
    /* the GPTDataset over the split's sequences [lo, hi) (all without a split) */
    long long lo, hi, stok;     /* the split's first and end sequence, its tokens */
    long long request;          /* num_samples asked for; -1: none (one epoch) */
    int epochs, separate;       /* epochs, and whether the last one is shuffled apart */
    long long ndoc;             /* epochs * nseq */
    int32_t *doc;               /* (ndoc) document index: sequence ids, shuffled */
    long long nsamples;         /* its length */
    int64_t *sample;            /* (nsamples + 1, 2) (document-index position, token offset) */
    int64_t *shuffle;           /* (nsamples) */
} mm_dataset;

struct lib_data {
    int n;                      /* datasets */
    mm_dataset *ds;             /* (n) */
    int seq;                    /* tokens per sample, less the extra one */
    long long size;             /* samples of the top-level dataset */
    int16_t *which;             /* (size) blends: dataset of each sample; NULL: no blend */
    int64_t *within;            /* (size) blends: its sample in that dataset */
};

static char *cat(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    RT_CHECK(s, "out of memory");
    memcpy(s, a, na);
    memcpy(s + na, b, nb + 1);
    return s;
}

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Token k of a buffer of tokens in dtype 'code'. */
static long long token_at(const unsigned char *p, int code, size_t k)
{
    switch (code) {
    case 1: return p[k];
    case 2: return (int8_t)p[k];
    case 3: { int16_t v; memcpy(&v, p + 2 * k, 2); return v; }
    case 4: { int32_t v; memcpy(&v, p + 4 * k, 4); return v; }
    case 5: { int64_t v; memcpy(&v, p + 8 * k, 8); return v; }
    case 8: { uint16_t v; memcpy(&v, p + 2 * k, 2); return v; }
    default: return -1;
    }
}

/* Read PREFIX.idx whole and check it against PREFIX.bin. */
static void mm_open(mm_dataset *m, const char *prefix)
{
    memset(m, 0, sizeof *m);
    m->bin = cat(prefix, ".bin");
    m->idx = cat(prefix, ".idx");
    int fd = open(m->idx, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st))
        lib_fail_file(m->idx, "cannot open: %s (a Megatron indexed dataset is PREFIX.bin and "
                      "PREFIX.idx)", strerror(errno));
    long long size = (long long)st.st_size;
    unsigned char *h = malloc(size > MM_HEADER ? (size_t)size : MM_HEADER);
    RT_CHECK(h, "out of memory");
    long long got = 0;
    while (got < size) {
        ssize_t r = pread(fd, h + got, (size_t)(size - got), got);
        if (r <= 0) lib_fail_file(m->idx, "cannot read: %s", r ? strerror(errno) : "short read");
        got += r;
    }
    close(fd);
    if (size < 9 || memcmp(h, MM_MAGIC, 9))
        lib_fail_file(m->idx, "bad magic: not a Megatron index (expected the bytes "
                      "\"MMIDIDX\\x00\\x00\" that tools/preprocess_data.py writes)");
    if (size < MM_HEADER)
        lib_fail_file(m->idx, "truncated: %lld bytes, shorter than the %d-byte header", size,
                      MM_HEADER);
    uint64_t version = le64(h + 9);
    if (version != 1)
        lib_fail_file(m->idx, "index version %llu; only version 1 is supported",
                      (unsigned long long)version);
    m->code = h[17];
    if (m->code < 1 || m->code >= MM_NCODES || m->code == 6 || m->code == 7)
        lib_fail_file(m->idx, "dtype code %d (%s): token ids need an integer dtype (codes 1-5 "
                      "and 8)", m->code, m->code >= 1 && m->code < MM_NCODES ?
                      mm_dtype_name[m->code] : "unknown");
    m->width = mm_dtype_bytes[m->code];
    uint64_t nseq = le64(h + 18), ndocs = le64(h + 26);
    if (nseq > ((uint64_t)1 << 40) || ndocs > ((uint64_t)1 << 40) ||
        (long long)(MM_HEADER + 12 * nseq + 8 * ndocs) > size)
        lib_fail_file(m->idx, "truncated: the header announces %llu sequences and %llu "
                      "documents (%llu bytes), the file has %lld", (unsigned long long)nseq,
                      (unsigned long long)ndocs,
                      (unsigned long long)(MM_HEADER + 12 * nseq + 8 * ndocs), size);
    if (nseq == 0) lib_fail_file(m->idx, "the dataset holds no sequences");
    m->nseq = (long long)nseq;
    m->len = malloc(4 * nseq);
    m->ptr = malloc(8 * nseq);
    RT_CHECK(m->len && m->ptr, "out of memory");
    memcpy(m->len, h + MM_HEADER, 4 * nseq);
    memcpy(m->ptr, h + MM_HEADER + 4 * nseq, 8 * nseq);
    free(h);

    m->fd = open(m->bin, O_RDONLY);
    if (m->fd < 0 || fstat(m->fd, &st)) lib_fail_file(m->bin, "cannot open: %s", strerror(errno));
    for (long long i = 0; i < m->nseq; i++) {
        if (m->len[i] < 0 || m->ptr[i] < 0)
            lib_fail_file(m->idx, "sequence %lld has length %d at byte %lld: corrupt index", i,
                          m->len[i], (long long)m->ptr[i]);
        /* unsigned: a pointer near 2^63 plus the length must not overflow (tests/fuzz) */
        uint64_t end = (uint64_t)m->ptr[i] + (uint64_t)m->len[i] * (uint64_t)m->width;
        if (end > (uint64_t)st.st_size)
            lib_fail_file(m->bin, "truncated: sequence %lld (%d %s tokens at byte %lld) ends at "
                          "byte %llu, the file has %lld bytes", i, m->len[i],
                          mm_dtype_name[m->code], (long long)m->ptr[i],
                          (unsigned long long)end, (long long)st.st_size);
        m->ntok += m->len[i];
    }
    if (m->ntok < 2)
        lib_fail_file(m->idx, "%lld tokens: a dataset needs at least 2", m->ntok);
}

/* Why a pread of 'want' bytes at byte 'at' returned 'got': the system's error, or a short
** read (errno is stale then: the file ended early, truncated since it was opened?). */
static const char *read_failure(char *buf, size_t cap, ssize_t got, size_t want, off_t at)
{
    if (got < 0) return strerror(errno);
    snprintf(buf, cap, "short read: %zd of %zu bytes at byte %lld (the file is shorter than "
             "when it was opened: truncated while in use?)", got, want, (long long)at);
    return buf;
}

/* 'n' tokens of sequence 's' from token 'off' on, as ints. */
static void mm_read(const mm_dataset *m, long long s, long long off, long long n, int *out)
{
    enum { CHUNK = 1 << 12 };
    unsigned char raw[8 * CHUNK];     /* CHUNK tokens of the widest dtype */
    RT_CHECK(s >= 0 && s < m->nseq && off >= 0 && off + n <= m->len[s],
             "%s: tokens [%lld, %lld) of sequence %lld requested, it has %d", m->bin, off,
             off + n, s, s >= 0 && s < m->nseq ? m->len[s] : -1);
    for (long long k = 0; k < n; k += CHUNK) {
        size_t c = (size_t)(n - k < CHUNK ? n - k : CHUNK), bytes = c * (size_t)m->width;
        off_t at = (off_t)m->ptr[s] + (off_t)(off + k) * m->width;
        ssize_t got = pread(m->fd, raw, bytes, at);
        char why[160];
        if (got != (ssize_t)bytes)
            RT_CHECK(0, "%s: cannot read sequence %lld: %s", m->bin, s,
                     read_failure(why, sizeof why, got, bytes, at));
        for (size_t i = 0; i < c; i++) {        /* ids beyond int read as -1: out of range */
            long long v = token_at(raw, m->code, i);
            out[k + (long long)i] = v < INT32_MIN || v > INT32_MAX ? -1 : (int)v;
        }
    }
}

/* -- GPTDataset's indices -------------------------------------------------------------------- */

/* The range [lo, hi) shuffled into a[0 .. hi-lo). */
static void shuffled_range(mt19937 *rs, int64_t *a, long long lo, long long hi)
{
    for (long long i = lo; i < hi; i++) a[i - lo] = i;
    mt_shuffle(rs, a, sizeof *a, hi - lo);
}

/*
** GPTDataset._build_document_sample_shuffle_indices for 'request' samples (-1: none, one epoch)
** of 'seq' + 1 tokens, seed 'seed': the epochs needed, the document index (the last epoch
** shuffled on its own when it would give fewer than 80 % of an epoch's samples), the sample
** index of build_sample_idx (drop the last partial sample, one extra token per sample) and the
** shuffle index, drawn in that order from one RandomState(seed).
*/
static void mm_build(mm_dataset *m, long long request, int seq, uint32_t seed)
{
    long long tpe = m->stok, sans = 0, ndocs = m->hi - m->lo;
    m->request = request;
    m->epochs = 1;
    if (request >= 0) {
        long long have = tpe, want = request * seq + 1;
        while (have < want) {
            m->epochs++;
            have += tpe;
        }
    }
    m->separate = 0;
    if (m->epochs > 1) {
        sans = ((m->epochs - 1) * tpe - 1) / seq;
        long long from_final = request - sans, per_epoch = (tpe - 1) / seq;
        m->separate = from_final < (long long)(0.80 * (double)per_epoch);
    }
    mt19937 *rs = malloc(sizeof *rs);
    RT_CHECK(rs, "out of memory");
    mt_seed(rs, seed);

    m->ndoc = m->epochs * ndocs;
    RT_CHECK(m->ndoc < INT32_MAX, "%s: %d epochs of %lld sequences: the document index holds "
             "int32", m->idx, m->epochs, ndocs);
    m->doc = malloc(sizeof *m->doc * (size_t)m->ndoc);
    RT_CHECK(m->doc, "out of memory");
    for (long long i = 0; i < m->ndoc; i++) m->doc[i] = (int32_t)(m->lo + i % ndocs);
    if (m->separate) {
        long long first = (m->epochs - 1) * ndocs;
        mt_shuffle(rs, m->doc, sizeof *m->doc, first);
        mt_shuffle(rs, m->doc + first, sizeof *m->doc, ndocs);
    } else {
        mt_shuffle(rs, m->doc, sizeof *m->doc, m->ndoc);
    }

    /* build_sample_idx: walk the document index, seq + 1 tokens per sample, the last token of
    ** a sample being the first of the next */
    long long ns = (m->epochs * tpe - 1) / seq;
    m->nsamples = ns;
    m->sample = malloc(sizeof *m->sample * 2 * (size_t)(ns + 1));
    m->shuffle = malloc(sizeof *m->shuffle * (size_t)(ns > 0 ? ns : 1));
    RT_CHECK(m->sample && m->shuffle, "out of memory");
    long long di = 0, off = 0;
    m->sample[0] = 0;
    m->sample[1] = 0;
    for (long long s = 1; s <= ns; s++) {
        long long remaining = seq + 1;
        while (remaining != 0) {
            long long dlen = m->len[m->doc[di]] - off;
            remaining -= dlen;
            if (remaining <= 0) {
                off += remaining + dlen - 1;
                remaining = 0;
            } else {
                if (di == m->ndoc - 1) {             /* out of documents: the last sample */
                    RT_CHECK(s == ns, "%s: build_sample_idx ran out of documents", m->idx);
                    off = m->len[m->doc[di]] - 1;
                    break;
                }
                di++;
                off = 0;
            }
        }
        m->sample[2 * s] = di;
        m->sample[2 * s + 1] = off;
    }

    if (m->separate) {
        shuffled_range(rs, m->shuffle, 0, sans);
        shuffled_range(rs, m->shuffle + sans, sans, ns);
    } else {
        shuffled_range(rs, m->shuffle, 0, ns);
    }
    free(rs);
}

/* GPTDataset[i]: its seq + 1 tokens (inputs, and the targets one token on). */
static void mm_sample(const mm_dataset *m, long long i, int seq, int *out)
{
    RT_CHECK(i >= 0 && i < m->nsamples, "%s: sample %lld of %lld", m->idx, i, m->nsamples);
    long long j = m->shuffle[i];
    long long b = m->sample[2 * j], bo = m->sample[2 * j + 1];
    long long e = m->sample[2 * j + 2], eo = m->sample[2 * j + 3];
    long long n = 0;
    for (long long k = b; k <= e; k++) {
        long long s = m->doc[k], from = k == b ? bo : 0;
        long long count = k < e ? m->len[s] - from : eo + 1 - from;
        RT_CHECK(count >= 0 && n + count <= seq + 1, "%s: sample %lld spans more than %d tokens",
                 m->idx, i, seq + 1);
        mm_read(m, s, from, count, out + n);
        n += count;
    }
    RT_CHECK(n == seq + 1, "%s: sample %lld has %lld tokens, not %d", m->idx, i, n, seq + 1);
}

/* -- Blends ---------------------------------------------------------------------------------- */

/* numpy.sum of a float64 vector: pairwise summation, 8 accumulators up to 128 elements. */
static double np_sum(const double *a, long long n)
{
    if (n < 8) {
        double r = 0.0;
        for (long long i = 0; i < n; i++) r += a[i];
        return r;
    }
    if (n <= 128) {
        double r[8];
        long long i;
        for (int k = 0; k < 8; k++) r[k] = a[k];
        for (i = 8; i < n - n % 8; i += 8)
            for (int k = 0; k < 8; k++) r[k] += a[i + k];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    long long n2 = n / 2;
    n2 -= n2 % 8;
    return np_sum(a, n2) + np_sum(a + n2, n - n2);
}

/* Megatron's utils.normalize: w / numpy.sum(w). */
static void normalize(double *w, int n)
{
    double sum = np_sum(w, n);
    for (int i = 0; i < n; i++) w[i] /= sum;
}

/* build_blending_indices: sample i goes to the dataset furthest behind its share. */
static void blend_indices(lib_data *d, const double *w)
{
    long long *used = calloc((size_t)d->n, sizeof *used);
    d->which = malloc(sizeof *d->which * (size_t)d->size);
    d->within = malloc(sizeof *d->within * (size_t)d->size);
    RT_CHECK(used && d->which && d->within, "out of memory");
    for (long long i = 0; i < d->size; i++) {
        double x = i > 1 ? (double)i : 1.0;
        int best = 0;
        double max = w[0] * x - (double)used[0];
        for (int k = 1; k < d->n; k++) {
            double err = w[k] * x - (double)used[k];
            if (err > max) {
                max = err;
                best = k;
            }
        }
        d->which[i] = (int16_t)best;
        d->within[i] = used[best]++;
    }
    for (int k = 0; k < d->n; k++)
        if (used[k] > d->ds[k].nsamples)
            lib_fail_file(d->ds[k].idx, "the blend takes %lld samples from this dataset, it has "
                          "%lld", used[k], d->ds[k].nsamples);
    free(used);
}

/* -- API ------------------------------------------------------------------------------------- */

/*
** Whether 'path' names a Megatron indexed dataset: PATH.idx exists (a prefix, as Megatron's
** --data-path takes it), or PATH is PREFIX.bin or PREFIX.idx with an index that starts with
** Megatron's magic. Sets *prefix to a new string (the caller frees) when it does.
*/
int lib_data_is_indexed(const char *path, char **prefix)
{
    *prefix = NULL;
    char *idx = cat(path, ".idx");
    int yes = access(idx, F_OK) == 0;
    free(idx);
    if (yes) {
        *prefix = cat(path, "");
        return 1;
    }
    size_t n = strlen(path);
    if (n > 4 && (!strcmp(path + n - 4, ".bin") || !strcmp(path + n - 4, ".idx"))) {
        char *stem = cat(path, "");
        stem[n - 4] = 0;
        idx = cat(stem, ".idx");
        char magic[9];
        FILE *f = fopen(idx, "rb");
        yes = f && fread(magic, 1, 9, f) == 9 && !memcmp(magic, MM_MAGIC, 9);
        if (f) fclose(f);
        free(idx);
        if (yes) *prefix = stem;
        else free(stem);
    }
    return yes;
}

/* -- Megatron's --split ------------------------------------------------------------------- */

const char *const lib_split_name[LIB_NSPLITS] = { "train", "valid", "test" };

/*
** --split "A,B,C": three numbers >= 0, not all zero (Megatron pads fewer with zeros and reads
** any digits in any text; we ask for the three, so that a typo is an error), normalised as
** Megatron's utils.normalize (each / numpy.sum). Returns NULL, or why the text is refused.
*/
const char *lib_split_parse(const char *text, double frac[LIB_NSPLITS])
{
    const char *p = text;
    for (int k = 0; k < LIB_NSPLITS; k++) {
        while (*p == ' ') p++;
        size_t n = strspn(p, "0123456789.");     /* a number as Megatron's pattern [.0-9]+ */
        char num[64], *end;
        if (n == 0 || n >= sizeof num)
            return *p == '-' ? "a share is negative" : "expected three numbers, e.g. 969,30,1";
        memcpy(num, p, n);
        num[n] = 0;
        frac[k] = strtod(num, &end);
        if (*end || !isfinite(frac[k])) return "expected three numbers, e.g. 969,30,1";
        p += n;
        while (*p == ' ') p++;
        if (k < LIB_NSPLITS - 1 && *p++ != ',')
            return "expected three numbers separated by commas (train,valid,test), e.g. "
                   "969,30,1 (Megatron reads 99,1 as 99,1,0: write the zero)";
    }
    if (*p) return "expected three numbers separated by commas (train,valid,test), e.g. 969,30,1";
    if (np_sum(frac, LIB_NSPLITS) <= 0) return "all three shares are zero";
    normalize(frac, LIB_NSPLITS);
    return NULL;
}

/*
** The documents [lo, hi) of split 'which' among n (blended_megatron_dataset_builder): the
** bounds are the running sums of the fractions (0, f0, f0 + f1, f0 + f1 + f2, summed in that
** order) times n, rounded half to even as Python's round; a split whose bounds are equal as
** fractions (a zero share) does not exist: returns 0 (Megatron builds no dataset for it).
** The last bound rounds to n, as the sum is 1 within a rounding error.
*/
int lib_split_bounds(const double frac[LIB_NSPLITS], int which, long long n, long long *lo,
                     long long *hi)
{
    double at[LIB_NSPLITS + 1] = { 0.0 };
    for (int k = 0; k < LIB_NSPLITS; k++) at[k + 1] = at[k] + frac[k];
    if (at[which + 1] <= at[which]) return 0;
    *lo = (long long)nearbyint(at[which] * (double)n);       /* FE_TONEAREST: half to even */
    *hi = (long long)nearbyint(at[which + 1] * (double)n);
    return 1;
}

/* The split's documents of m, or all of them (split NULL); fails naming the dataset when the
** split holds no tokens. */
static void mm_split(mm_dataset *m, const double *split, int which)
{
    m->lo = 0;
    m->hi = m->nseq;
    if (split && !lib_split_bounds(split, which, m->nseq, &m->lo, &m->hi))
        lib_fail_all(2, "--split: the %s split has a share of zero", lib_split_name[which]);
    m->stok = 0;
    for (long long i = m->lo; i < m->hi; i++) m->stok += m->len[i];
    if (m->stok < 2)
        lib_fail_file(m->idx, "the %s split holds %lld sequences [%lld, %lld) of %lld, %lld "
                      "tokens: too few for a sample (--split gives it a larger share?)",
                      lib_split_name[which], m->hi - m->lo, m->lo, m->hi, m->nseq, m->stok);
}

/*
** Open the n datasets 'prefixes' and build Megatron's indices for 'request' samples of seq + 1
** tokens with seed 'seed', over split 'which' of --split's fractions 'split' (NULL: no split,
** every document). weights NULL and n == 1: one GPTDataset of 'request' samples.
** weights given: a BlendedDataset of Megatron's size (the sum of ceil(request * w)), each
** dataset built for its share plus Megatron's 0.5 % surplus. weights NULL and n > 1: one epoch
** of each, blended by their lengths, as Megatron blends a list of prefixes without weights.
** 'verbose': rank 0 prints one line per dataset. Bad files: lib_fail_file (every rank exits).
*/
lib_data *lib_data_open(int n, char *const *prefixes, const double *weights,
                        const double *split, int which, int seq, long long request,
                        unsigned long long seed, int verbose)
{
    if (seq < 2) lib_fail_all(2, "a Megatron dataset needs a sequence length of at least 2");
    if (n < 1 || n >= 32767) lib_fail_all(2, "a blend has 1 to 32766 datasets, not %d", n);
    lib_data *d = calloc(1, sizeof *d);
    RT_CHECK(d, "out of memory");
    d->n = n;
    d->seq = seq;
    d->ds = calloc((size_t)n, sizeof *d->ds);
    double *w = malloc(sizeof *w * (size_t)n);
    RT_CHECK(d->ds && w, "out of memory");
    for (int k = 0; k < n; k++) {
        mm_open(&d->ds[k], prefixes[k]);
        mm_split(&d->ds[k], split, which);
    }
    if (weights) {
        /* _get_size_per_split_per_dataset: the target (ceil(N w)) and the built (with surplus) */
        for (int k = 0; k < n; k++) {
            if (!(weights[k] > 0) || isinf(weights[k]))
                lib_fail_all(2, "--data-path: weight %g of %s must be a finite number > 0",
                             weights[k], prefixes[k]);
            w[k] = weights[k];
        }
        if (isinf(np_sum(w, n))) {          /* normalising would make every share 0 */
            int big = 0;
            for (int k = 1; k < n; k++) if (w[k] > w[big]) big = k;
            lib_fail_all(2, "--data-path: the weights sum to more than the largest double "
                         "(%g; the largest weight is %g of %s): scale them down", DBL_MAX,
                         w[big], prefixes[big]);
        }
        normalize(w, n);
        d->size = 0;
        for (int k = 0; k < n; k++) {
            double target = ceil((double)request * w[k]);
            d->size += (long long)target;
            mm_build(&d->ds[k], (long long)ceil(target * (1.0 + 0.005)), seq, (uint32_t)seed);
        }
        normalize(w, n);                   /* BlendedDataset normalises its weights again */
        blend_indices(d, w);
    } else if (n == 1) {
        mm_build(&d->ds[0], request, seq, (uint32_t)seed);
        d->size = d->ds[0].nsamples;
    } else {
        long long total = 0;
        for (int k = 0; k < n; k++) {
            mm_build(&d->ds[k], -1, seq, (uint32_t)seed);
            w[k] = (double)d->ds[k].nsamples;
            total += d->ds[k].nsamples;
        }
        normalize(w, n);
        d->size = request < total ? request : total;
        blend_indices(d, w);
    }
    if (verbose && rt_rank() == 0) {
        for (int k = 0; k < n; k++) {
            const mm_dataset *m = &d->ds[k];
            printf("data: %s: %lld sequences, %lld %s tokens", m->bin, m->nseq, m->ntok,
                   mm_dtype_name[m->code]);
            for (int j = 0; split && j < LIB_NSPLITS; j++) {     /* every split's documents */
                long long lo, hi;
                if (lib_split_bounds(split, j, m->nseq, &lo, &hi))
                    printf("%s %s [%lld, %lld)", j ? "," : "; split:", lib_split_name[j], lo, hi);
                else printf("%s %s none", j ? "," : "; split:", lib_split_name[j]);
            }
            if (split)
                printf("; the %s split's %lld tokens", lib_split_name[which], m->stok);
            printf("; %d epoch%s%s, %lld samples of %d tokens", m->epochs,
                   m->epochs > 1 ? "s" : "", m->separate ? " (last apart)" : "", m->nsamples,
                   seq + 1);
            if (d->which) printf("; weight %.6g", w[k]);
            printf("\n");
        }
        printf("data: %lld %s%ssamples%s, seed %llu\n", d->size, split ? lib_split_name[which] :
               "", split ? " " : "", d->which ? " blended" : "", seed);
    }
    free(w);
    return d;
}

/* Samples of the top-level dataset (GPTDataset or BlendedDataset). */
long long lib_data_size(const lib_data *d)
{
    return d->size;
}

/* Sample i of the top-level dataset: its seq + 1 token ids into out. */
void lib_data_sample(const lib_data *d, long long i, int *out)
{
    RT_CHECK(i >= 0 && i < d->size, "data: sample %lld of %lld", i, d->size);
    if (d->which) mm_sample(&d->ds[d->which[i]], d->within[i], d->seq, out);
    else mm_sample(&d->ds[0], i, d->seq, out);
}

/* The world's first bad position of n, from each rank's first ('bad', -1 if none): the
** maximum of n - position (0 when clean) over the world; -1 when every rank is clean. */
static long long first_bad(long long bad, long long n, lib_world_max_fn *world_max)
{
    long long key = bad < 0 ? 0 : n - bad;
    world_max(&key);
    return key ? n - key : -1;
}

/*
** Every token of every dataset must be in [0, vocab). The ranks share each file's scan (rank r
** reads the sequences whose first token lies in slice r of the tokens) and agree on the first
** bad position with world_max (a maximum over the world); then all fail alike, naming it.
*/
void lib_data_check_vocab(const lib_data *d, int vocab, lib_world_max_fn *world_max)
{
    enum { CHUNK = 1 << 16 };
    int *buf = malloc(sizeof *buf * CHUNK);
    RT_CHECK(buf, "out of memory");
    for (int k = 0; k < d->n; k++) {
        const mm_dataset *m = &d->ds[k];
        long long per = (m->ntok + rt_world() - 1) / rt_world();
        long long lo = per * rt_rank(), hi = lo + per, first = 0, bad = -1;
        for (long long s = 0; s < m->nseq && bad < 0; first += m->len[s], s++) {
            if (first < lo || first >= hi) continue;
            for (long long at = 0; at < m->len[s] && bad < 0; at += CHUNK) {
                long long c = m->len[s] - at < CHUNK ? m->len[s] - at : CHUNK;
                mm_read(m, s, at, c, buf);
                for (long long i = 0; i < c; i++)
                    if (buf[i] < 0 || buf[i] >= vocab) {
                        bad = first + at + i;
                        break;
                    }
            }
        }
        long long pos = first_bad(bad, m->ntok, world_max), s = 0;
        if (pos < 0) continue;
        while (pos >= m->len[s]) pos -= m->len[s++];
        int tok;
        mm_read(m, s, pos, 1, &tok);
        lib_fail_file(m->bin, "token %d at position %lld of sequence %lld is out of range: the "
                      "model's vocabulary has %d ids (0..%d); was the dataset made for another "
                      "tokenizer?", tok, pos, s, vocab, vocab - 1);
    }
    free(buf);
}

/* Close the files and free the indices. */
void lib_data_free(lib_data *d)
{
    if (!d) return;
    for (int k = 0; k < d->n; k++) {
        mm_dataset *m = &d->ds[k];
        if (m->fd > 0) close(m->fd);
        free(m->bin);
        free(m->idx);
        free(m->len);
        free(m->ptr);
        free(m->doc);
        free(m->sample);
        free(m->shuffle);
    }
    free(d->ds);
    free(d->which);
    free(d->within);
    free(d);
}

/* -- Token files: nanoGPT .bin (uint16) and llm.c shards ------------------------------------- */

#define LLMC_MAGIC  20240520   /* llm.c token shard: 256 int32 header, then uint16 tokens */
#define LLMC_HEADER 1024

static int32_t le32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

/*
** Every token must be < vocab. The ranks share the scan (rank r reads slice r of the world's
** slices, so a large file costs each rank 1/world of a read) and agree on the first bad
** position with one all-reduce; then all fail alike, naming it.
*/
static void tokens_check(const lib_tokens *d, int vocab, lib_world_max_fn *world_max)
{
    enum { CHUNK = 1 << 16 };
    static unsigned char raw[2 * CHUNK];
    long long per = (d->ntok + rt_world() - 1) / rt_world();
    long long lo = per * rt_rank(), hi = lo + per < d->ntok ? lo + per : d->ntok;
    long long bad = -1;
    for (long long at = lo; at < hi && bad < 0; at += CHUNK) {
        size_t n = (size_t)(hi - at < CHUNK ? hi - at : CHUNK);
        off_t from = d->first + 2 * (off_t)at;
        ssize_t got = pread(d->fd, raw, 2 * n, from);
        char why[160];
        if (got != (ssize_t)(2 * n))
            RT_CHECK(0, "%s: cannot read tokens: %s", d->path,
                     read_failure(why, sizeof why, got, 2 * n, from));
        for (size_t k = 0; k < n; k++)
            if ((raw[2 * k] | raw[2 * k + 1] << 8) >= vocab) {
                bad = at + (long long)k;
                break;
            }
    }
    long long pos = first_bad(bad, d->ntok, world_max);
    if (pos < 0) return;
    unsigned char t2[2] = { 0, 0 };
    char why[160];
    ssize_t got = pread(d->fd, t2, 2, d->first + 2 * (off_t)pos);
    if (got != 2)
        RT_CHECK(0, "%s: cannot read tokens: %s", d->path,
                 read_failure(why, sizeof why, got, 2, d->first + 2 * (off_t)pos));
    lib_fail_file(d->path, "token %d at position %lld is out of range: the model's vocabulary has "
              "%d ids (0..%d); was the file made for another tokenizer?", t2[0] | t2[1] << 8,
              pos, vocab, vocab - 1);
}

/* Open and check a token file; every rank opens it (errors are the same everywhere). */
void lib_tokens_open(lib_tokens *d, const char *path, int seq, int vocab,
                     lib_world_max_fn *world_max)
{
    struct stat st;
    d->path = path;
    d->fd = open(path, O_RDONLY);
    if (d->fd < 0 || fstat(d->fd, &st)) lib_fail_file(path, "cannot open: %s", strerror(errno));
    long long size = (long long)st.st_size;
    unsigned char h[12];
    d->first = 0;
    if (size >= LLMC_HEADER && pread(d->fd, h, sizeof h, 0) == (ssize_t)sizeof h &&
        le32(h) == LLMC_MAGIC) {
        if (le32(h + 4) != 1)
            lib_fail_file(path, "llm.c shard version %d; only version 1 (uint16 tokens) is "
                      "supported", le32(h + 4));
        d->ntok = le32(h + 8);
        d->first = LLMC_HEADER;
        if (d->ntok < 0 || size != LLMC_HEADER + 2 * d->ntok)
            lib_fail_file(path, "llm.c shard header announces %lld tokens but %lld bytes follow "
                      "it (%lld expected): truncated or corrupt", d->ntok,
                      size - LLMC_HEADER, 2 * d->ntok);
    } else {
        if (size % 2)
            lib_fail_file(path, "odd size (%lld bytes): expected little-endian uint16 tokens "
                      "(nanoGPT .bin) or an llm.c shard (magic %d)", size, LLMC_MAGIC);
        d->ntok = size / 2;
    }
    d->nsamples = d->ntok > 0 ? (d->ntok - 1) / seq : 0;
    if (d->nsamples < 1)
        lib_fail_file(path, "%lld tokens: too short for one sample (sequence length %d needs %d "
                  "tokens)", d->ntok, seq, seq + 1);
    tokens_check(d, vocab, world_max);
}


/* -- What a run trains on: the flags' data, a step's batches ------------------------------ */

/*
** The samples Megatron's training.py asks of split 'which' (get_train_valid_test_num_samples):
** train: the steps' global batches; valid: --eval-iters global batches at each evaluation,
** after every --eval-interval-th step and once more at the end; test: one evaluation's. Plus
** 'base': the samples a run whose global batch changed (--reshard-from) read beyond those of
** this program's batches at its steps (consumed samples - start x GBS; 0 otherwise).
*/
static long long split_request(const lib_flags *f, const gpt_program *prog, int which,
                               long long base)
{
    if (which == LIB_SPLIT_TRAIN) return base + (long long)f->steps * prog->gbs;
    long long iters = f->eval_iters;
    if (which == LIB_SPLIT_VALID) iters *= f->steps / f->eval_interval + 1;
    return base + iters * prog->gbs;
}

/*
** A Megatron indexed dataset (--data PREFIX) or blend (--data-path [W] PREFIX ...), sampled as
** Megatron's GPTDataset / BlendedDataset for split_request's samples of split 'which' of
** --split (all documents without it) of seq + 1 tokens, seed --data-seed; every rank builds
** the same indices and checks the tokens < vocab.
*/
static void open_indexed(lib_tokens *d, const lib_flags *f, const gpt_program *prog, int which,
                         long long base, lib_world_max_fn *world_max)
{
    double split[LIB_NSPLITS];
    if (f->split) {
        const char *why = lib_split_parse(f->split, split);
        if (why) lib_fail_all(2, "--split '%s': %s", f->split, why);
    }
    int n = f->ndata_path ? f->ndata_path : 1;
    char **words = f->ndata_path ? f->data_path : &d->prefix;
    double *w = NULL;
    if (n > 1 && n % 2 == 0) {         /* Megatron's get_blend_from_list: W P W P ... */
        w = malloc(sizeof *w * (size_t)(n / 2));
        char **pre = malloc(sizeof *pre * (size_t)(n / 2));
        RT_CHECK(w && pre, "out of memory");
        int numbers = 0;
        for (int k = 0; k < n / 2; k++) {
            char *end;
            w[k] = strtod(words[2 * k], &end);
            numbers += end != words[2 * k] && !*end;
            pre[k] = words[2 * k + 1];
        }
        if (numbers == n / 2) {
            words = pre;
            n /= 2;
        } else {
            if (numbers) lib_fail_all(2, "--data-path: give a weight before every prefix or none");
            free(pre);
            free(w);
            w = NULL;
        }
    }
    long long need = split_request(f, prog, which, base);
    d->path = words[0];
    d->mm = lib_data_open(n, words, w, f->split ? split : NULL, which, prog->dims.seq, need,
                          f->data_seed, !f->quiet && (!f->dump_samples || f->split));
    d->nsamples = lib_data_size(d->mm);
    if (d->nsamples < need && !f->split)
        lib_fail_file(d->path, "the blend holds %lld samples, %d steps of %d need %lld",
                      d->nsamples, f->steps, prog->gbs, need);
    if (d->nsamples < need)
        lib_fail_file(d->path, "the blend's %s split holds %lld samples, %lld are needed",
                      lib_split_name[which], d->nsamples, need);
    if (!f->dump_samples) lib_data_check_vocab(d->mm, prog->vocab, world_max);   /* ids as is */
    if (w) free(words);
    free(w);
}

/*
** Open the data the flags name for 'prog' (every rank alike): --data-path's datasets, --data's
** Megatron dataset when it names one (lib_data_is_indexed), else --data's token file. Checks
** the files (lib_fail_file) and every token id < vocab (with --dump-samples, a dataset's ids
** are left unchecked: they are printed as they are). 't' is then read by lib_tokens_batch and
** released by lib_tokens_close.
*/
void lib_tokens_open_flags(lib_tokens *t, const lib_flags *f, const gpt_program *prog,
                           long long base, lib_world_max_fn *world_max)
{
    if (f->ndata_path || lib_data_is_indexed(f->data, &t->prefix))
        open_indexed(t, f, prog, LIB_SPLIT_TRAIN, base, world_max);
    else if (f->split)
        lib_fail_all(2, "--split divides the documents of a Megatron dataset (--data PREFIX, "
                     "--data-path); %s is a token file", f->data);
    else lib_tokens_open(t, f->data, prog->dims.seq, prog->vocab, world_max);
}

/*
** Split 'which' (valid or test) of the Megatron datasets the flags name, after
** lib_tokens_open_flags opened the train split into 'train' (which says whether they are
** Megatron datasets): for the evaluations (--eval-interval) and --dump-split.
*/
void lib_tokens_open_split(lib_tokens *t, const lib_tokens *train, const lib_flags *f,
                           const gpt_program *prog, int which, long long base,
                           lib_world_max_fn *world_max)
{
    RT_CHECK(train->mm && f->split, "lib_tokens_open_split: no split (a library bug)");
    if (which == LIB_SPLIT_VALID && !f->eval_interval)
        lib_fail_all(2, "the valid split's samples depend on --eval-interval (Megatron builds "
                     "the split for every evaluation of the run): give it");
    if (!f->ndata_path) t->prefix = cat(train->prefix, "");
    open_indexed(t, f, prog, which, base, world_max);
}

/* The split --dump-split names (LIB_SPLIT_*); a name that is none is a usage error. */
int lib_split_named(const char *name)
{
    for (int k = 0; k < LIB_NSPLITS; k++)
        if (!strcmp(name, lib_split_name[k])) return k;
    lib_fail_all(2, "--dump-split must be train, valid or test, got '%s'", name);
    return -1;
}

/*
** --dump-samples K: "sample I: ids..." (seq + 1 ids) for samples 0..K-1 of the Megatron dataset
** on rank 0's stdout. A token file, or K beyond the dataset, is a usage error on every rank.
** The caller ends the run.
*/
void lib_tokens_dump(const lib_tokens *t, int count, int seq)
{
    if (!t->mm) lib_fail_all(2, "--dump-samples needs a Megatron dataset");
    if (count > t->nsamples)
        lib_fail_all(2, "--dump-samples %d: the dataset has %lld samples", count, t->nsamples);
    int *tok = malloc(sizeof *tok * ((size_t)seq + 1));
    RT_CHECK(tok, "out of memory");
    for (int i = 0; i < count && rt_rank() == 0; i++) {
        lib_data_sample(t->mm, i, tok);
        printf("sample %d:", i);
        for (int k = 0; k <= seq; k++) printf(" %d", tok[k]);
        printf("\n");
    }
    fflush(stdout);
    free(tok);
}

/*
** Token ids of this rank's micro-batches for the global batch of samples from 'first' (step s
** of a run: s*GBS, or the samples consumed before it when the global batch changed),
** sequence-major: inputs[k][t*B + b] for micro-batch k, sample b. Sample i is tokens
** [i*S, i*S + S] of a token file (S = the sequence length), or sample i of a Megatron dataset;
** the batch is samples (first + j) mod nsamples, j = 0..GBS-1. From a token file, data-parallel rank d ('dp') takes
** j in [d*B*NMB, (d+1)*B*NMB), micro-batch k the B samples from d*B*NMB + k*B; from a Megatron
** dataset, as Megatron's pretraining sampler hands them out, micro-batch k of rank d takes the
** B samples from k*B*DP + d*B. Local position t (of the T a rank holds) is the sample's
** position position[t]: under context parallelism the positions of the rank's two chunks.
** A token file changed under the run fails this rank (RT_CHECK).
*/
void lib_tokens_batch(const lib_tokens *d, const gpt_program *prog, const int *position,
                      long long first, int dp, int *inputs, int *targets)
{
    const gpt_dims *D = &prog->dims;
    int S = D->seq;
    unsigned char *raw = malloc(2 * ((size_t)S + 1));
    int *ids = malloc(sizeof *ids * ((size_t)S + 1));
    RT_CHECK(raw && ids, "out of memory");
    for (int k = 0; k < D->nmb; k++)
        for (int b = 0; b < D->B; b++) {
            long long j = (long long)dp * D->B * D->nmb + (long long)k * D->B + b;
            if (d->mm)      /* Megatron's sampler: micro-batch k of every rank, then k + 1 */
                j = (long long)k * (prog->gbs / D->nmb) + (long long)dp * D->B + b;
            long long i = (first + j) % d->nsamples;
            if (d->mm) {
                lib_data_sample(d->mm, i, ids);
            } else {
                off_t at = d->first + (off_t)2 * i * S;
                ssize_t want = 2 * ((ssize_t)S + 1);
                ssize_t got = pread(d->fd, raw, (size_t)want, at);
                char why[160];
                if (got != want)
                    RT_CHECK(0, "%s: cannot read sample %lld: %s", d->path, i,
                             read_failure(why, sizeof why, got, (size_t)want, at));
                for (int g = 0; g <= S; g++) ids[g] = raw[2 * g] | raw[2 * g + 1] << 8;
            }
            for (int t = 0; t < D->T; t++) {
                int g = position[t];              /* input at g, target at g + 1 */
                int tok = ids[g], next = ids[g + 1];
                int bad = tok < 0 || tok >= prog->vocab ? tok : next < 0 || next >= prog->vocab ?
                          next : -1;
                RT_CHECK(bad < 0 || d->mm, "%s: token %d at position %lld is out of range for "
                         "vocabulary %d (the file changed while training?)", d->path, bad,
                         i * S + g + (tok < prog->vocab), prog->vocab);
                RT_CHECK(bad < 0, "%s: token %d in sample %lld is out of range for vocabulary "
                         "%d (the file changed while training?)", d->path, bad, i, prog->vocab);
                inputs[(size_t)k * D->N + (size_t)t * D->B + b] = tok;
                targets[(size_t)k * D->N + (size_t)t * D->B + b] = next;
            }
        }
    free(ids);
    free(raw);
}

/* Release what lib_tokens_open_flags holds (the datasets' indices and files, --data's prefix);
** a token file's descriptor stays open until the process ends. */
void lib_tokens_close(lib_tokens *t)
{
    lib_data_free(t->mm);
    free(t->prefix);
    t->mm = NULL;
    t->prefix = NULL;
}
