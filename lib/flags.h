/*
** flags.h: the training program's command line (flags.c): the record every flag lands in and
** the parser that fills it. The parser is pure but for its errors, which go through
** lib_fail_all (code 2, "train: error: ..." on rank 0), so it is also what tests/fuzz drives.
*/
#ifndef GPT_FLAGS_H
#define GPT_FLAGS_H

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

typedef struct {
    const char *data, *init, *save, *log, *ckpt_dir;
    char **data_path;         /* --data-path's words (argv); ndata_path of them */
    int ndata_path, dump_samples;
    unsigned long long data_seed;
    int steps, warmup, decay_steps, ckpt_every, resume, quiet, show_groups;
    double lr, min_lr, beta1, beta2, eps, wd, clip, timeout;
    unsigned long long seed;
    int have_min_lr, have_decay_steps;
    double lr_init;           /* --lr-warmup-init: the rate of the first warm-up step */
    int lr_style, wsd_style;  /* LR_* and WSD_* above */
    int wsd_iters;            /* --lr-wsd-decay-iters; -1 when not given */
    const char *wsd_flag;     /* the first WSD-only flag given, to report it without WSD */
    /* faults (README.md, "When things go wrong") */
    int exit_signals;         /* --exit-signal: a mask of 1 << SIGxxx; 0 = none */
    double exit_grace;        /* --exit-grace S: abort S seconds after the signal; 0 = never */
    double exit_minutes;      /* --exit-duration-in-mins: save and exit after this; 0 = never */
    int exit_interval;        /* --exit-interval N: save and exit after step k*N; 0 = never */
    int skip_bad_steps;       /* --skip-bad-steps N: non-finite steps skipped before stopping */
    int help;                 /* -h / --help: print the usage and exit 0 */
} lib_flags;

/* Fill 'f' from argv[1..argc-1] with the defaults for what is not given; a bad flag or a
** combination that makes no sense is a usage error (lib_fail_all(2, ...)). */
void lib_flags_parse(int argc, char **argv, lib_flags *f);

/* The learning rate of the optimizer step after 'done' completed steps, for a global batch of
** 'gbs' sequences: Megatron's schedule (lib/train.c). Pure. */
double lib_lr_at(const lib_flags *f, long long gbs, int done);

/* The names of the decay styles, NULL-terminated (for messages and the usage). */
extern const char *const lib_lr_style_names[], *const lib_wsd_style_names[];

/* "SIGTERM", "SIGUSR1", ... for the signals --exit-signal accepts; NULL for others. */
const char *lib_signal_name(int sig);

#endif
