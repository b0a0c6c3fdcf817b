/*
** ref_io.h: the reference's file formats -- safetensors read (F32, BF16, F16, F64 -> double)
** and write (F32), whole-model load/save in Hugging Face GPT-2 or Llama layout, and token data
** files (nanoGPT .bin or llm.c shard) with the fixed batching of tests/ref/README.md.
** Written independently of the runtime's readers so that both can be checked against each other.
** Errors are printed to stderr as "path: error: message" and the function returns -1.
*/
#ifndef REF_IO_H
#define REF_IO_H

#include <stddef.h>
#include <stdint.h>

#include "gpt2_ref.h"   // defines: ref_model, ref_config, REF_NAME_MAX

/* -- safetensors ------------------------------------------------------------------------------ */

#define REF_ST_MAX_DIMS 8

typedef struct ref_st_tensor {
    char name[REF_NAME_MAX];
    char dtype[16];             /* as in the header: "F32", "BF16", "F16", "F64", "U8", ... */
    int ndim;
    long shape[REF_ST_MAX_DIMS];
    size_t begin, end;          /* data_offsets, relative to the start of the data section */
} ref_st_tensor;

typedef struct ref_st_file {
    const char *path;           /* as given to ref_st_open, not copied */
    unsigned char *bytes;       /* the whole file */
    size_t size;
    size_t data_start;          /* 8 + header length */
    int ntensors;
    ref_st_tensor *tensors;     /* [ntensors], in header order */
} ref_st_file;

/* One tensor to write: name, shape and ndim doubles-per-element data (rounded to F32). */
typedef struct ref_st_entry {
    const char *name;
    int ndim;
    long shape[REF_ST_MAX_DIMS];
    const double *data;
} ref_st_entry;

int ref_st_open(ref_st_file *f, const char *path);
void ref_st_close(ref_st_file *f);
const ref_st_tensor *ref_st_find(const ref_st_file *f, const char *name);
size_t ref_st_numel(const ref_st_tensor *t);
int ref_st_read(const ref_st_file *f, const ref_st_tensor *t, double *dst);
int ref_st_write(const char *path, const ref_st_entry *entries, int n);

int ref_model_load(ref_model *m, const char *path);
int ref_model_save(const ref_model *m, const char *path);

/* -- Token data ------------------------------------------------------------------------------- */

#define REF_SHARD_MAGIC 20240520
#define REF_SHARD_HEADER_BYTES 1024

typedef struct ref_data {
    uint16_t *tokens;           /* (ntokens) */
    size_t ntokens;
    size_t nsamples;            /* (ntokens - 1) div T */
    int seq;                    /* T */
    int is_shard;               /* 1: llm.c shard, 0: headerless uint16 */
} ref_data;

int ref_data_load(ref_data *d, const char *path, int vocab, int seq);
void ref_data_free(ref_data *d);
void ref_data_batch(const ref_data *d, long step, int gbs, int *inputs, int *targets);

#endif
