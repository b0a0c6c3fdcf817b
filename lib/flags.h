/*
** flags.h: the training program's command line (flags.c): one table of every flag (LIB_FLAGS),
** the record the flags land in, the parser that fills it and the texts printed from the table
** (train --help; README.md's table, `make readme-flags`). The parser is pure but for its
** errors, which go through lib_fail_all (code 2, "train: error: ..." on rank 0), so it is
** also what tests/fuzz drives. Another program (generate) parses its own table of the same
** kinds with the same parser (lib_flags_table).
*/
#ifndef GPT_FLAGS_H
#define GPT_FLAGS_H

#include <stdio.h>

/* Learning-rate decay styles (--lr-decay-style) and WSD's final decay (--lr-wsd-decay-style),
** spelled as Megatron's --lr-decay-style and --lr-wsd-decay-style. */
#define LR_STYLES(_) _(COSINE, "cosine") _(CONSTANT, "constant") _(LINEAR, "linear") \
    _(INVERSE_SQRT, "inverse-square-root") _(WSD, "WSD")
#define WSD_STYLES(_) _(EXPONENTIAL, "exponential") _(LINEAR, "linear") _(COSINE, "cosine") \
    _(MINUS_SQRT, "minus_sqrt")
#define LR_ENUM(id, name) LR_##id,
#define WSD_ENUM(id, name) WSD_##id,
enum { LR_STYLES(LR_ENUM) };
enum { WSD_STYLES(WSD_ENUM) };

/*
** Every flag, in the order of the usage and of README.md's table:
**   _(ID, name, META, KIND, field, default, help)
** ID names the flag in code (LIB_FLAG_<ID>: its index, as in lib_flags.given). KIND says how
** the value is read into 'field' of lib_flags (flags.c checks the field's type):
**   STRING  the word as is (const char *)     INT     0 .. 1e9 (int)
**   NUM     a finite number (double)          U64     an unsigned decimal (unsigned long long)
**   U32     an unsigned decimal < 2^32        FLAG    no value: sets the int to 1
**   HELP    no value: sets the int to 1 and stops parsing (-h is the same)
**   LR_STYLE, WSD_STYLE   one of LR_STYLES / WSD_STYLES' names (int: LR_* / WSD_*)
**   SIGNALS "none" or names from flags.c's signals, comma-separated (int: 1 << SIGxxx each)
**   WORDS   every word up to the next flag (char **: argv; --data-path, the one such flag,
**           counts them in ndata_path)
** The default is the text the parser reads before the command line, as if it were given (so
** the documented default is the default), NULL for none (zero, NULL), or "=TEXT" for a value
** lib_flags_parse derives after the command line (TEXT documents it). In the help, `code` is
** printed as code in README.md and plainly in the usage; "%s" stands for the kind's choices.
*/
#define LIB_FLAGS(_) \
    _(DATA, "data", "FILE", STRING, data, NULL, \
      "token file: little-endian uint16 ids (nanoGPT `.bin`), an llm.c shard (1024-byte " \
      "header, magic 20240520), or the `PREFIX` of a Megatron indexed dataset (`PREFIX.bin` " \
      "+ `PREFIX.idx`)") \
    _(DATA_PATH, "data-path", "[W] PREFIX [W PREFIX ...]", WORDS, data_path, NULL, \
      "Megatron indexed datasets, blended with weights `W` as Megatron's `--data-path` " \
      "(without weights: by their sizes); sampled as its `GPTDataset` and `BlendedDataset` " \
      "(README.md, \"Megatron indexed datasets\")") \
    _(DATA_SEED, "data-seed", "N", U32, data_seed, "1234", \
      "Megatron's `--seed` for the data indices") \
    _(DUMP_SAMPLES, "dump-samples", "K", INT, dump_samples, NULL, \
      "print the token ids of the run's first K samples of a Megatron dataset (T+1 each, " \
      "`sample I: ids`) and exit") \
    _(DUMP_SPLIT, "dump-split", "S", STRING, dump_split, "train", \
      "the split `--dump-samples` prints: `train`, `valid` (the samples the evaluations read, " \
      "in their order) or `test`") \
    _(SPLIT, "split", "A,B,C", STRING, split, NULL, \
      "as Megatron's `--split`: the train, valid and test shares of every Megatron dataset's " \
      "documents (e.g. `969,30,1`); training reads the train split (README.md, " \
      "\"Validation\")") \
    _(EVAL_INTERVAL, "eval-interval", "N", INT, eval_interval, NULL, \
      "evaluate on the valid split after every N-th step and after the last (needs `--split`): " \
      "forward only, the loss of `--eval-iters` global batches, logged as `eval_loss` and " \
      "`eval_ppl`") \
    _(EVAL_ITERS, "eval-iters", "K", INT, eval_iters, "100", \
      "global batches of the valid split per evaluation, K >= 1") \
    _(STEPS, "steps", "N", INT, steps, "10", \
      "optimizer steps; 0 only initialises, loads or saves the model") \
    _(SEED, "seed", "N", U64, seed, "1337", \
      "initialisation seed when there is no `--init`") \
    _(INIT, "init", "PATH", STRING, init, NULL, \
      "start from a Hugging Face checkpoint: one `.safetensors` file, the " \
      "`model.safetensors.index.json` of a sharded one (its shards beside it), or a " \
      "directory holding that index or one `model.safetensors` (as `--save DIR` writes); the " \
      "model's Hugging Face tensor names (GPT-2's with or without `transformer.`, Llama, " \
      "Mixtral) and shapes, in F32, BF16 or F16; a tied model's `lm_head.weight` must equal " \
      "the embedding") \
    _(SAVE, "save", "PATH", STRING, save, NULL, \
      "write the whole model after the last step, with its Hugging Face names (any layout " \
      "loads it with `--init`): `FILE.safetensors` writes one file; any other path a " \
      "directory `transformers` loads (`config.json`, `generation_config.json`, safetensors " \
      "shards past `--save-shard-size` with their index, the `--tokenizer` files; README.md, " \
      "\"Hugging Face checkpoints\"), replacing an earlier export there") \
    _(SAVE_DTYPE, "save-dtype", "D", STRING, save_dtype, "f32", \
      "the dtype `--save` writes: `f32`, or `bf16` (rounded to nearest even, as torch does)") \
    _(SAVE_SHARD_SIZE, "save-shard-size", "SIZE", STRING, save_shard_size, "5GB", \
      "`--save DIR`: the largest safetensors file, as `save_pretrained`'s `max_shard_size`: " \
      "bytes, or a number with `KB`, `MB`, `GB`, `TB` (powers of 1000) or `KiB`, `MiB`, " \
      "`GiB`, `TiB`") \
    _(TOKENIZER, "tokenizer", "PATH", STRING, tokenizer, NULL, \
      "`--save DIR`: copy this Hugging Face `tokenizer.json` (or a directory's), and the " \
      "`tokenizer_config.json` and `special_tokens_map.json` beside it, into the export") \
    _(LOG, "log", "FILE", STRING, log, NULL, \
      "one JSON object per step: `step, loss, lr, grad_norm, ms, comm_ms, tok_s, tflops` " \
      "(`comm_ms`: rank 0's time blocked on communication in the step, the part not " \
      "overlapped; `tflops`: the model's FLOPs of the step, as Megatron counts them, per " \
      "second and device; `mfu` with `--peak-tflops`; " \
      "`aux_loss` with MoE; `mem_mib, mem_peak_mib`: rank 0's device memory held now and " \
      "at most, as the runtime counts it (the memory plan); `rss_mib`: rank 0's resident " \
      "host memory; `\"skipped\":true` and `null` for non-finite numbers on a " \
      "skipped step); with `--eval-interval` also one per evaluation: `step, eval_loss, " \
      "eval_ppl, eval_ms` (`\"final\":true` on the one after the last step)") \
    _(LR, "lr", "X", NUM, lr, "6e-4", \
      "peak learning rate (the optimizer's numbers are 32-bit floats: at most 3.4e38)") \
    _(MIN_LR, "min-lr", "X", NUM, min_lr, "=0.1*lr", \
      "final learning rate; Megatron's `--min-lr` defaults to 0") \
    _(LR_DECAY_STYLE, "lr-decay-style", "S", LR_STYLE, lr_style, "cosine", \
      "the decay after the warm-up (README.md, \"Learning rate\"): %s") \
    _(WARMUP, "warmup", "N", INT, warmup, "0", \
      "linear warm-up steps") \
    _(LR_WARMUP_INIT, "lr-warmup-init", "X", NUM, lr_init, "0", \
      "the rate of the first warm-up step") \
    _(DECAY_STEPS, "decay-steps", "N", INT, decay_steps, "=max(steps, warmup)", \
      "the decay ends at `--min-lr` after N steps") \
    _(LR_WSD_DECAY_ITERS, "lr-wsd-decay-iters", "N", INT, wsd_iters, NULL, \
      "WSD only, and required there: the last N of the decay steps decay") \
    _(LR_WSD_DECAY_STYLE, "lr-wsd-decay-style", "S", WSD_STYLE, wsd_style, "exponential", \
      "WSD only: how those last N steps decay: %s") \
    _(BETA1, "beta1", "X", NUM, beta1, "0.9", "AdamW's beta1, in [0, 1)") \
    _(BETA2, "beta2", "X", NUM, beta2, "0.95", "AdamW's beta2, in [0, 1)") \
    _(EPS, "eps", "X", NUM, eps, "1e-8", "AdamW's epsilon, > 0") \
    _(WD, "wd", "X", NUM, wd, "0.1", \
      "AdamW's weight decay, >= 0, applied to the 2-D weights and the embeddings only") \
    _(CLIP, "clip", "X", NUM, clip, "1.0", "clip the gradient norm to X, >= 0; 0: no clipping") \
    _(CKPT_DIR, "ckpt-dir", "DIR", STRING, ckpt_dir, NULL, \
      "the directory of resume checkpoints (`step_N/rank_R.bin`): written by `--ckpt-every`, " \
      "the exit signals and the exit limits, read by `--resume`") \
    _(CKPT_EVERY, "ckpt-every", "N", INT, ckpt_every, "0", \
      "write a resume checkpoint after every N-th step, if N > 0") \
    _(RESUME, "resume", "", FLAG, resume, NULL, \
      "continue bit-exactly from the newest complete checkpoint in `--ckpt-dir` (none there: " \
      "start from the beginning)") \
    _(RESHARD_FROM, "reshard-from", "DIR", STRING, reshard_from, NULL, \
      "start from the newest complete checkpoint in DIR, written by another layout (TP, PP, " \
      "VP, DP, CP, EP, ETP, SP, DIST_OPT, BF16, MBS, NMB) of the same model: its parameters, " \
      "AdamW moments, steps and the samples read so far, redistributed to this layout; with " \
      "`--resume`, only when `--ckpt-dir` has no checkpoint yet") \
    _(EXIT_SIGNAL, "exit-signal", "LIST", SIGNALS, exit_signals, "SIGTERM,SIGUSR1", \
      "on these signals finish the step, save a checkpoint to `--ckpt-dir` and exit 0 " \
      "(README.md, \"When things go wrong\"); LIST: `none` (the signals' default action) " \
      "or comma-separated names, with or without `SIG`, from %s") \
    _(EXIT_GRACE, "exit-grace", "S", NUM, exit_grace, "0", \
      "abort S seconds after that signal if the checkpoint is not written by then; 0: no " \
      "limit") \
    _(EXIT_DURATION_IN_MINS, "exit-duration-in-mins", "X", NUM, exit_minutes, "0", \
      "as Megatron's flag: save a checkpoint to `--ckpt-dir` and exit 0 once X minutes " \
      "have passed, if X > 0") \
    _(EXIT_INTERVAL, "exit-interval", "N", INT, exit_interval, "0", \
      "as Megatron's flag: save a checkpoint to `--ckpt-dir` and exit 0 after every N-th " \
      "step, if N > 0") \
    _(SKIP_BAD_STEPS, "skip-bad-steps", "N", INT, skip_bad_steps, "0", \
      "skip up to N steps whose loss or gradient norm is not finite; at the next such " \
      "step, stop, naming the rank and the tensor") \
    _(TIMEOUT, "timeout", "S", NUM, timeout, "300", \
      "abort the job if a collective or receive is stuck for S seconds") \
    _(TENSORBOARD_DIR, "tensorboard-dir", "DIR", STRING, tb_dir, NULL, \
      "also write every step's scalars to a TensorBoard event file in DIR (created if " \
      "missing): `lm loss`, `learning-rate`, `grad-norm`, `iteration-time` (s), " \
      "`tokens-per-second`, `throughput` (TFLOP/s per device), `mem-allocated-bytes`, " \
      "`mem-max-allocated-bytes`, `mem-host-resident-bytes`, `mfu` with `--peak-tflops`, " \
      "`aux-loss` with MoE, `lm loss validation` and `lm loss validation ppl` with " \
      "`--eval-interval`; a resumed run's file makes TensorBoard drop the steps it repeats") \
    _(LOG_INTERVAL, "log-interval", "N", INT, log_interval, "1", \
      "print the step line on stdout every N-th step, N >= 1 (and the first and the last); " \
      "the `--log` file has every step") \
    _(PEAK_TFLOPS, "peak-tflops", "X", NUM, peak_tflops, NULL, \
      "one device's peak TFLOP/s at the run's precision (e.g. 989 for an H100 SXM in bf16, " \
      "dense), for the model FLOPs utilization: the step line and the `--log` file report " \
      "`mfu` = TFLOP/s per device / X") \
    _(QUIET, "quiet", "", FLAG, quiet, NULL, \
      "no per-step line on stdout (nor the first line: model, parameters, layout, global " \
      "batch; nor the `--ckpt-every` checkpoints' lines)") \
    _(SHOW_GROUPS, "show-groups", "", FLAG, show_groups, NULL, \
      "print every rank's coordinates and groups (as `topology.json` lists them), then exit") \
    _(HELP, "help", "", HELP, help, NULL, "print this help and exit (also `-h`)")

#define LIB_FLAG_ID(id, name, meta, kind, field, def, help) LIB_FLAG_##id,
enum { LIB_FLAGS(LIB_FLAG_ID) LIB_NFLAGS };

/*
** Megatron-LM's spellings of flags that mean the same here, accepted as the flag itself
** (docs/megatron-flags.md maps every Megatron flag: these, the ones spelled alike, the layout's
** make variables, and those we do not have): _(ALIAS, ID) with ID a LIB_FLAGS ID. Only the
** defaults may differ from Megatron's (the usage and README's table give ours).
*/
#define LIB_FLAG_ALIASES(_) \
    _("train-iters", STEPS) _("lr-warmup-iters", WARMUP) _("lr-decay-iters", DECAY_STEPS) \
    _("weight-decay", WD) _("adam-beta1", BETA1) _("adam-beta2", BETA2) _("adam-eps", EPS) \
    _("clip-grad", CLIP) _("save-interval", CKPT_EVERY)

/* How a flag's value is read (the KIND column above) and the type of the field it fills. */
#define LIB_FLAG_KINDS(_) _(STRING, const char *) _(INT, int) _(NUM, double) \
    _(U64, unsigned long long) _(U32, unsigned long long) _(FLAG, int) _(HELP, int) \
    _(LR_STYLE, int) _(WSD_STYLE, int) _(SIGNALS, int) _(WORDS, char **)
#define LIB_FLAG_KIND_ENUM(kind, type) KIND_##kind,
enum { LIB_FLAG_KINDS(LIB_FLAG_KIND_ENUM) };

/* A row of a flag table: LIB_FLAGS's, or another program's (generate's, lib_flags_table). */
typedef struct {
    const char *name, *meta;    /* "data", "FILE" (the flag is --data FILE) */
    int kind;                   /* KIND_* */
    size_t field;               /* offset of the field in the record (lib_flags) */
    const char *def, *help;     /* as in LIB_FLAGS */
} lib_flag_def;

typedef struct {
    const char *data, *init, *save, *log, *ckpt_dir, *reshard_from;
    const char *tb_dir;       /* --tensorboard-dir */
    const char *save_dtype, *save_shard_size, *tokenizer;   /* --save's form (hfdir.h) */
    int save_bf16;            /* --save-dtype bf16 */
    long long save_shard_bytes;   /* --save-shard-size in bytes */
    const char *split;        /* --split "A,B,C" (data.c reads it); NULL: no split */
    const char *dump_split;   /* --dump-split: train, valid or test */
    int eval_interval;        /* --eval-interval N; 0: no evaluation */
    int eval_iters;           /* --eval-iters K */
    char **data_path;         /* --data-path's words (argv); ndata_path of them */
    int ndata_path, dump_samples;
    unsigned long long data_seed;
    int steps, warmup, decay_steps, ckpt_every, resume, quiet, show_groups;
    int log_interval;         /* --log-interval N: the step line every N-th step */
    double lr, min_lr, beta1, beta2, eps, wd, clip, timeout;
    double peak_tflops;       /* --peak-tflops X: for the MFU; 0: not given */
    unsigned long long seed;
    double lr_init;           /* --lr-warmup-init: the rate of the first warm-up step */
    int lr_style, wsd_style;  /* LR_* and WSD_* above */
    int wsd_iters;            /* --lr-wsd-decay-iters (given: LIB_FLAG_LR_WSD_DECAY_ITERS) */
    const char *wsd_flag;     /* the first WSD-only flag given, to report it without WSD */
    /* faults (README.md, "When things go wrong") */
    int exit_signals;         /* --exit-signal: a mask of 1 << SIGxxx; 0 = none */
    double exit_grace;        /* --exit-grace S: abort S seconds after the signal; 0 = never */
    double exit_minutes;      /* --exit-duration-in-mins: save and exit after this; 0 = never */
    int exit_interval;        /* --exit-interval N: save and exit after step k*N; 0 = never */
    int skip_bad_steps;       /* --skip-bad-steps N: non-finite steps skipped before stopping */
    int help;                 /* -h / --help: print the usage and exit 0 */
    unsigned char given[LIB_NFLAGS];   /* flag LIB_FLAG_<ID> is on the command line */
} lib_flags;

void lib_flags_parse(int argc, char **argv, lib_flags *f);
void lib_flags_usage(FILE *out, const char *run_hint);
void lib_flags_markdown(FILE *out);
int lib_flags_table(int argc, char **argv, const lib_flag_def *defs, int n, void *rec,
                    unsigned char *given);
void lib_flags_table_usage(FILE *out, const char *usage, const lib_flag_def *defs, int n);
const char *lib_signal_name(int sig);

#endif
