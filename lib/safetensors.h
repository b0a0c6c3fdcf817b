/*
** safetensors.h: reading and writing safetensors files, the one implementation the training
** library and the tools (tools/stcompare) share. A file is an 8-byte little-endian header
** length, a JSON header {"name": {"dtype": "F32", "shape": [r, c], "data_offsets": [b, e]},
** ..., "__metadata__": {...}} padded with spaces, then the data; offsets are relative to the
** data. This module parses and writes headers and converts elements, and reads the layout of
** Hugging Face checkpoints (a directory, the index JSON of a sharded one); it knows nothing
** about models (which tensors a checkpoint must hold is the caller's business).
*/
#ifndef GPT_SAFETENSORS_H
#define GPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ORDER ST_DTYPE: name as written in headers, bytes per element. */
#define ST_DTYPES(_) \
    _(F64, 8) _(F32, 4) _(F16, 2) _(BF16, 2) \
    _(I64, 8) _(I32, 4) _(I16, 2) _(I8, 1) _(U64, 8) _(U32, 4) _(U16, 2) _(U8, 1) _(BOOL, 1)

typedef enum {
#define ST_DT_ENUM(name, size) ST_##name,
    ST_DTYPES(ST_DT_ENUM)
#undef ST_DT_ENUM
    ST_UNKNOWN              /* a dtype name this module does not know (kept in dtype_name) */
} st_dtype;

/* The keys of a tensor entry, counted by the reader (ST_KEY_OTHER: any other key). */
enum { ST_KEY_DTYPE, ST_KEY_SHAPE, ST_KEY_OFFSETS, ST_KEY_OTHER, ST_KEYS };

#define ST_MAX_DIMS   8
#define ST_NAME_MAX   256
#define ST_HEADER_MAX (1ll << 30)   /* larger headers are refused (a corrupt length) */

typedef struct {
    char      name[ST_NAME_MAX];    /* longer names are cut (and then match nothing) */
    st_dtype  dtype;
    char      dtype_name[16];       /* as written, for messages */
    int       ndim;                 /* ST_MAX_DIMS + 1: more dimensions than kept */
    long long shape[ST_MAX_DIMS];
    long long begin, end;           /* data_offsets as written (-1: absent) */
    unsigned char keys[ST_KEYS];    /* how often each key appeared (a strict check wants 1 1 1 0) */
} st_tensor;

typedef struct {
    int        fd;
    long long  size;                /* bytes in the file */
    long long  data;                /* absolute offset of the data: 8 + header length */
    int        n;                   /* tensors, in header order, duplicates kept */
    st_tensor *t;
} st_file;

/*
** Open 'path' and parse its header into f (the file stays open for st_read_*). Returns 0, or
** -1 with a message in err[cap] that does not name the path: "cannot open: No such file",
** "not a safetensors file (...)", "malformed safetensors header (expected ':', at byte 12 of
** the JSON)". Tensors whose entries are well-formed JSON are kept whatever their values (the
** caller checks dtypes, shapes and offsets against what it needs); "__metadata__" is skipped.
*/
int  st_open(st_file *f, const char *path, char *err, size_t cap);
void st_close(st_file *f);                       /* closes the file, frees the list */

const st_tensor *st_find(const st_file *f, const char *name);  /* first of that name, or NULL */
int         st_dtype_size(st_dtype t);                          /* 0 for ST_UNKNOWN */
const char *st_dtype_text(st_dtype t);
/* the product of the shape; -1 for a negative dimension or a product over 2^60 */
long long   st_numel(const st_tensor *t);
/* Whether t's data_offsets span exactly its elements and lie inside the file. */
int         st_extent_ok(const st_file *f, const st_tensor *t);

/*
** Read elements [first, first + n) of t (row-major) converted to f32: F32 exactly, BF16
** exactly, F16 exactly (subnormals, inf and NaN kept). Other dtypes: returns -1 with errno
** EINVAL. Returns 0, or -1 with errno set by the failed read (EIO on a short read).
*/
int st_read_f32(const st_file *f, const st_tensor *t, long long first, long long n, float *out);

/* Element i of little-endian data of dtype t, as a double (any dtype but ST_UNKNOWN). */
double st_value(const unsigned char *data, st_dtype t, size_t i);
float  st_half_to_f32(uint16_t h);

/* -- Hugging Face checkpoints: one file, or shards named by an index ---------------------- */

/* The file names save_pretrained writes: the index of a sharded checkpoint, the single file. */
#define ST_INDEX_NAME  "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"
#define ST_INDEX_MAX   (64ll << 20)   /* larger index files are refused (Llama 70B's: 60 KB) */
#define ST_PATH_MAX    4096

/*
** What a checkpoint path names: a safetensors file, an index ("*.json"), or a directory
** holding ST_INDEX_NAME or ST_SINGLE_NAME (not both). Writes the file to read into out[cap]
** (PATH, or PATH/NAME) and sets *is_index. Returns 0, or -1 with a message in err[errcap]
** that does not name the path: "cannot open: No such file or directory", "no
** model.safetensors.index.json or model.safetensors in this directory", ...
*/
int st_resolve(const char *path, char *out, size_t cap, int *is_index, char *err,
               size_t errcap);

/* One weight_map entry: a tensor and the shard that holds it. */
typedef struct {
    char name[ST_NAME_MAX];
    int  shard;                     /* into st_index.shard */
} st_entry;

/* model.safetensors.index.json: {"metadata": {...}, "weight_map": {"name": "file", ...}}. */
typedef struct {
    int        n;                   /* weight_map entries, in file order (names unique) */
    st_entry  *map;
    const st_entry **byname;        /* [n] the entries sorted by name (st_index_find) */
    int        nshards;             /* distinct shard file names, in order of first mention */
    char     (*shard)[ST_NAME_MAX];
} st_index;

/*
** Read and parse the index 'path' into ix (strict JSON: one object, "weight_map" an object of
** strings, other top-level keys skipped, nothing after the object). Returns 0, or -1 with a
** message in err[cap] that does not name the path: "cannot open: ...", "malformed index
** JSON (expected ':', at byte 57)", "malformed index JSON (tensor 'x' mapped twice, at byte
** 80)". Names of 256 bytes or more are refused, not cut. ix needs st_index_free either way.
*/
int  st_index_read(st_index *ix, const char *path, char *err, size_t cap);
void st_index_free(st_index *ix);
const st_entry *st_index_find(const st_index *ix, const char *name);  /* or NULL */

/* The path of shard 'k' of the index at 'index_path': relative to the index's directory. */
void st_index_shard_path(const st_index *ix, int k, const char *index_path, char *out,
                         size_t cap);

/*
** The header of a file holding 'n' tensors laid out one after another in the order given
** (their begin/end are set here; dtype and shape are read). Returns a malloc'd buffer of
** *len bytes: the 8-byte length, the JSON with {"__metadata__": {"format": "pt"}} first, and
** the space padding that makes the data start at a multiple of 8. NULL when out of memory.
*/
unsigned char *st_header(st_tensor *t, int n, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
