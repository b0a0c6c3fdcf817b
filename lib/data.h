/*
** data.h: the training data (data.c): Megatron indexed datasets (PREFIX.bin + PREFIX.idx)
** sampled as its GPTDataset and BlendedDataset ("train" split, whole corpus), nanoGPT / llm.c
** token files, and the token ids of a step's micro-batches. Every rank builds the same indices;
** a bad file is reported once (lib_fail_file) and every rank stops alike. Called by gpt_main
** (lib_tokens_*) and by the fuzz harnesses (tests/fuzz: lib_data_*, lib_tokens_open).
*/
#ifndef GPT_DATA_H
#define GPT_DATA_H

#include "flags.h"    // defines: lib_flags (--data, --data-path, --data-seed, --dump-samples)
#include "gpt.h"      // defines: gpt_program (sizes, global batch, vocabulary)

/* A maximum over the world of one value per rank (every rank calls it alike): how the ranks
** that share a file's scan agree on its first bad token. */
typedef void lib_world_max_fn(long long *v);

/* -- Megatron indexed datasets ------------------------------------------------------------ */

/* Megatron's --split: the train, valid and test shares of every dataset's documents. */
enum { LIB_SPLIT_TRAIN, LIB_SPLIT_VALID, LIB_SPLIT_TEST, LIB_NSPLITS };
extern const char *const lib_split_name[LIB_NSPLITS];       /* "train", "valid", "test" */
const char *lib_split_parse(const char *text, double frac[LIB_NSPLITS]);   /* NULL or why */
int lib_split_bounds(const double frac[LIB_NSPLITS], int which, long long n, long long *lo,
                     long long *hi);

typedef struct lib_data lib_data;
int lib_data_is_indexed(const char *path, char **prefix);   /* *prefix: new string */
lib_data *lib_data_open(int n, char *const *prefixes, const double *weights,
                        const double *split, int which, int seq, long long request,
                        unsigned long long seed, int verbose);
long long lib_data_size(const lib_data *d);
void lib_data_sample(const lib_data *d, long long i, int *out);   /* (seq + 1) ids */
void lib_data_check_vocab(const lib_data *d, int vocab, lib_world_max_fn *world_max);
void lib_data_free(lib_data *d);

/* -- What a run trains on ------------------------------------------------------------------ */

/* A token file (--data FILE): nanoGPT's uint16 .bin or an llm.c shard; or, when mm is set, a
** Megatron dataset or blend (--data PREFIX, --data-path). */
typedef struct {
    const char *path;         /* the file, or the first dataset's prefix (for messages) */
    int fd;                   /* a token file's descriptor, open for the run */
    long long first;          /* byte offset of token 0 */
    long long ntok, nsamples;
    lib_data *mm;             /* a Megatron indexed dataset or blend; NULL: a token file */
    char *prefix;             /* --data's PREFIX (owned) when it names a Megatron dataset */
} lib_tokens;
void lib_tokens_open(lib_tokens *t, const char *path, int seq, int vocab,
                     lib_world_max_fn *world_max);
void lib_tokens_open_flags(lib_tokens *t, const lib_flags *f, const gpt_program *prog,
                           long long base, lib_world_max_fn *world_max);
void lib_tokens_open_split(lib_tokens *t, const lib_tokens *train, const lib_flags *f,
                           const gpt_program *prog, int which, long long base,
                           lib_world_max_fn *world_max);
int lib_split_named(const char *name);
void lib_tokens_dump(const lib_tokens *t, int count, int seq);
void lib_tokens_batch(const lib_tokens *t, const gpt_program *prog, const int *position,
                      long long first, int dp, int *inputs, int *targets);
void lib_tokens_close(lib_tokens *t);

#endif
