/*
** hfdir.h: the Hugging Face model directory that --save DIR writes (hfdir.c): what
** `transformers` loads from the directory alone. The safetensors files (one model.safetensors,
** or model-0000k-of-0000N.safetensors split by save_pretrained's rule past --save-shard-size,
** with model.safetensors.index.json), config.json (GPT2Config, LlamaConfig or MixtralConfig,
** from the model's facts), generation_config.json and the tokenizer files of --tokenizer. The
** directory is written as DIR.tmp beside DIR and renamed at the end: whole or not at all.
** weights.c writes the tensors into the files this module names; rank 0 does the rest.
*/
#ifndef GPT_HFDIR_H
#define GPT_HFDIR_H

#include <stddef.h>

#include "safetensors.h"   // defines: st_tensor, st_dtype

#define HF_TMP_SUFFIX ".tmp"   /* DIR.tmp: the directory being written */

/* Whether --save names a directory: an existing directory, or a path not ending in
** ".safetensors" (which names one file, as before). */
int lib_hf_is_dir(const char *save);

/*
** save_pretrained's split of n tensors of bytes[i] (in checkpoint order) into files of at most
** 'limit' bytes: a tensor that would overflow the file being filled closes it, a tensor larger
** than the limit gets a file of its own at once, and the files are numbered in the order they
** are closed (so a large tensor's file may come before the smaller ones around it). Sets
** file_of[i]; returns the number of files.
*/
int lib_hf_shards(const long long *bytes, int n, long long limit, int *file_of);

/* The name of file k of nfiles: model.safetensors, or model-0000k-of-0000N.safetensors. */
void lib_hf_file_name(int k, int nfiles, char *out, size_t cap);

/*
** Start-up checks of --save DIR (rank 0; a message into msg[cap] and 0 when one fails): the
** model has a Hugging Face architecture (GPT-2, Llama, Mixtral as configured), DIR is absent,
** empty or holds only an export's files (then it is replaced), DIR.tmp can be made, and
** --tokenizer names a tokenizer.json (or a directory holding one). *where gets the path at
** fault.
*/
int lib_hf_check(const char *dir, const char *tokenizer, char *msg, size_t cap,
                 const char **where);

/* Rank 0: DIR.tmp made afresh (a stale one of regular files removed) into tmp[cap]. */
void lib_hf_begin(const char *dir, char *tmp, size_t cap);

/*
** Rank 0, once every tensor is in tmp's files and synced: the index (nfiles > 1; weight_map
** sorted by name, metadata.total_size), config.json, generation_config.json, the tokenizer
** files, then DIR.tmp becomes DIR (an earlier DIR swapped out and removed).
*/
void lib_hf_finish(const char *dir, const char *tmp, const st_tensor *ts, const int *file_of,
                   int n, int nfiles, st_dtype dtype, const char *tokenizer);

#endif
