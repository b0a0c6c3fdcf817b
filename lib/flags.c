/*
** flags.c: the training program's command line (flags.h). Defaults are the ones README.md and
** the usage give; every error names the flag and what it expects.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fail.h"     // defines: lib_fail_all
#include "flags.h"

#define STYLE_NAME(id, name) name,
const char *const lib_lr_style_names[] = { LR_STYLES(STYLE_NAME) NULL };
const char *const lib_wsd_style_names[] = { WSD_STYLES(STYLE_NAME) NULL };

/* The signals --exit-signal accepts (Slurm's --signal and preemption send one of these). */
static const struct { int sig; const char *name; } exit_signals[] = {
    { SIGTERM, "SIGTERM" }, { SIGUSR1, "SIGUSR1" }, { SIGUSR2, "SIGUSR2" },
    { SIGINT, "SIGINT" }, { SIGHUP, "SIGHUP" },
};
#define NSIGNALS (int)(sizeof exit_signals / sizeof exit_signals[0])

const char *lib_signal_name(int sig)
{
    for (int k = 0; k < NSIGNALS; k++)
        if (exit_signals[k].sig == sig) return exit_signals[k].name;
    return NULL;
}

static int parse_num(const char *flag, const char *v, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(d))
        lib_fail_all(2, "%s expects a number, got '%s'", flag, v);
    *out = d;
    return 1;
}

static int parse_int(const char *flag, const char *v, int *out)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < 0 || n > 1000000000)
        lib_fail_all(2, "%s expects a non-negative integer, got '%s'", flag, v);
    *out = (int)n;
    return 1;
}

/* The index of 'v' in the NULL-terminated 'names', or a usage error listing them. */
static int parse_style(const char *flag, const char *v, const char *const *names, int *out)
{
    for (int k = 0; names[k]; k++)
        if (!strcmp(v, names[k])) return *out = k, 1;
    char list[160] = "";
    for (int k = 0; names[k]; k++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                 k == 0 ? "" : names[k + 1] ? ", " : " or ", names[k]);
    lib_fail_all(2, "%s must be %s, got '%s'", flag, list, v);
    return 0;
}

/* --exit-signal: "none", or names separated by commas, with or without "SIG" (SIGTERM,USR1). */
static void parse_signals(const char *flag, const char *v, int *mask)
{
    *mask = 0;
    if (!strcmp(v, "none")) return;
    const char *p = v;
    while (1) {
        size_t n = strcspn(p, ",");
        int found = 0;
        for (int k = 0; k < NSIGNALS && !found; k++) {
            const char *name = exit_signals[k].name;
            if ((n == strlen(name) && !strncmp(p, name, n)) ||
                (n == strlen(name) - 3 && !strncmp(p, name + 3, n)))
                *mask |= 1 << exit_signals[k].sig, found = 1;
        }
        if (!found || n == 0)
            lib_fail_all(2, "%s expects none or signal names from SIGTERM, SIGUSR1, SIGUSR2, "
                         "SIGINT, SIGHUP separated by commas, got '%s'", flag, v);
        if (!p[n]) return;
        p += n + 1;
    }
}

/* The value after flag argv[*i] (advancing *i), or a usage error naming the flag. */
static const char *flag_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) lib_fail_all(2, "%s needs a value (try --help)", argv[*i]);
    return argv[++*i];
}

/* The schedule's flags make sense together (Megatron's scheduler asserts the same bounds, except
** that --decay-steps may equal --warmup: then the warm-up ends at min-lr's step). */
static void check_lr_flags(const lib_flags *f)
{
    if (f->min_lr < 0 || f->lr < f->min_lr)
        lib_fail_all(2, "the learning rates must satisfy 0 <= --min-lr (%g) <= --lr (%g)",
                     f->min_lr, f->lr);
    if (f->lr_init > f->lr)
        lib_fail_all(2, "--lr-warmup-init (%g) must be <= --lr (%g)", f->lr_init, f->lr);
    if (f->decay_steps < f->warmup)
        lib_fail_all(2, "--decay-steps (%d) must be >= --warmup (%d)", f->decay_steps, f->warmup);
    if (f->steps > 0 && f->decay_steps < 1)
        lib_fail_all(2, "--decay-steps must be >= 1 (the step count after which the rate is "
                     "min-lr)");
    if (f->lr_style != LR_WSD && f->wsd_flag)
        lib_fail_all(2, "%s needs --lr-decay-style WSD", f->wsd_flag);
    if (f->lr_style == LR_WSD && f->wsd_iters < 0)
        lib_fail_all(2, "--lr-decay-style WSD needs --lr-wsd-decay-iters N (the number of "
                     "steps of its final decay)");
    if (f->lr_style == LR_WSD && f->wsd_iters > f->decay_steps)
        lib_fail_all(2, "--lr-wsd-decay-iters (%d) must be <= --decay-steps (%d)", f->wsd_iters,
                     f->decay_steps);
}

void lib_flags_parse(int argc, char **argv, lib_flags *f)
{
    memset(f, 0, sizeof *f);
    f->steps = 10;
    f->lr = 6e-4;
    f->beta1 = 0.9;
    f->beta2 = 0.95;
    f->eps = 1e-8;
    f->wd = 0.1;
    f->clip = 1.0;
    f->timeout = 300;
    f->seed = 1337;
    f->data_seed = 1234;
    f->lr_style = LR_COSINE;
    f->wsd_style = WSD_EXPONENTIAL;
    f->wsd_iters = -1;
    f->exit_signals = 1 << SIGTERM | 1 << SIGUSR1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            f->help = 1;
            return;
        }
        if (strncmp(a, "--", 2))
            lib_fail_all(2, "unexpected argument '%s' (every flag starts with --; try --help)", a);
        if (!strcmp(a, "--resume")) { f->resume = 1; continue; }
        if (!strcmp(a, "--quiet")) { f->quiet = 1; continue; }
        if (!strcmp(a, "--show-groups")) { f->show_groups = 1; continue; }
        if (!strcmp(a, "--data")) f->data = flag_value(argc, argv, &i);
        else if (!strcmp(a, "--data-path")) {
            f->data_path = argv + i + 1;        /* its words: up to the next flag */
            f->ndata_path = 0;                  /* given twice: the last one counts */
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) i++, f->ndata_path++;
            if (!f->ndata_path) lib_fail_all(2, "--data-path needs [WEIGHT] PREFIX ...");
        } else if (!strcmp(a, "--data-seed")) {
            const char *v = flag_value(argc, argv, &i);
            char *end;
            errno = 0;
            f->data_seed = strtoull(v, &end, 10);
            if (errno || *v < '0' || *v > '9' || *end || f->data_seed > 0xffffffffull)
                lib_fail_all(2, "--data-seed expects an integer in [0, 2^32), got '%s'", v);
        } else if (!strcmp(a, "--dump-samples"))
            parse_int(a, flag_value(argc, argv, &i), &f->dump_samples);
        else if (!strcmp(a, "--init")) f->init = flag_value(argc, argv, &i);
        else if (!strcmp(a, "--save")) f->save = flag_value(argc, argv, &i);
        else if (!strcmp(a, "--log")) f->log = flag_value(argc, argv, &i);
        else if (!strcmp(a, "--ckpt-dir")) f->ckpt_dir = flag_value(argc, argv, &i);
        else if (!strcmp(a, "--steps")) parse_int(a, flag_value(argc, argv, &i), &f->steps);
        else if (!strcmp(a, "--warmup")) parse_int(a, flag_value(argc, argv, &i), &f->warmup);
        else if (!strcmp(a, "--decay-steps"))
            f->have_decay_steps = parse_int(a, flag_value(argc, argv, &i), &f->decay_steps);
        else if (!strcmp(a, "--ckpt-every"))
            parse_int(a, flag_value(argc, argv, &i), &f->ckpt_every);
        else if (!strcmp(a, "--lr")) parse_num(a, flag_value(argc, argv, &i), &f->lr);
        else if (!strcmp(a, "--min-lr"))
            f->have_min_lr = parse_num(a, flag_value(argc, argv, &i), &f->min_lr);
        else if (!strcmp(a, "--lr-warmup-init"))
            parse_num(a, flag_value(argc, argv, &i), &f->lr_init);
        else if (!strcmp(a, "--lr-decay-style"))
            parse_style(a, flag_value(argc, argv, &i), lib_lr_style_names, &f->lr_style);
        else if (!strcmp(a, "--lr-wsd-decay-style")) {
            parse_style(a, flag_value(argc, argv, &i), lib_wsd_style_names, &f->wsd_style);
            if (!f->wsd_flag) f->wsd_flag = a;
        } else if (!strcmp(a, "--lr-wsd-decay-iters")) {
            parse_int(a, flag_value(argc, argv, &i), &f->wsd_iters);
            if (!f->wsd_flag) f->wsd_flag = a;
        } else if (!strcmp(a, "--beta1")) parse_num(a, flag_value(argc, argv, &i), &f->beta1);
        else if (!strcmp(a, "--beta2")) parse_num(a, flag_value(argc, argv, &i), &f->beta2);
        else if (!strcmp(a, "--eps")) parse_num(a, flag_value(argc, argv, &i), &f->eps);
        else if (!strcmp(a, "--wd")) parse_num(a, flag_value(argc, argv, &i), &f->wd);
        else if (!strcmp(a, "--clip")) parse_num(a, flag_value(argc, argv, &i), &f->clip);
        else if (!strcmp(a, "--timeout")) parse_num(a, flag_value(argc, argv, &i), &f->timeout);
        else if (!strcmp(a, "--exit-signal"))
            parse_signals(a, flag_value(argc, argv, &i), &f->exit_signals);
        else if (!strcmp(a, "--exit-grace"))
            parse_num(a, flag_value(argc, argv, &i), &f->exit_grace);
        else if (!strcmp(a, "--exit-duration-in-mins"))
            parse_num(a, flag_value(argc, argv, &i), &f->exit_minutes);
        else if (!strcmp(a, "--exit-interval"))
            parse_int(a, flag_value(argc, argv, &i), &f->exit_interval);
        else if (!strcmp(a, "--skip-bad-steps"))
            parse_int(a, flag_value(argc, argv, &i), &f->skip_bad_steps);
        else if (!strcmp(a, "--seed")) {
            const char *v = flag_value(argc, argv, &i);
            char *end;
            errno = 0;
            f->seed = strtoull(v, &end, 10);
            if (errno || *v < '0' || *v > '9' || *end)
                lib_fail_all(2, "--seed expects a non-negative integer, got '%s'", v);
        } else lib_fail_all(2, "unknown flag '%s' (try --help)", a);
    }
    if (!f->have_min_lr) f->min_lr = 0.1 * f->lr;
    if (!f->have_decay_steps) f->decay_steps = f->steps > f->warmup ? f->steps : f->warmup;
    check_lr_flags(f);
    if (f->steps > 0 && !f->data && !f->ndata_path && !f->show_groups)
        lib_fail_all(2, "--data FILE is needed to train (or --steps 0)");
    if (f->data && f->ndata_path) lib_fail_all(2, "--data and --data-path exclude each other");
    if ((f->ckpt_every || f->resume) && !f->ckpt_dir)
        lib_fail_all(2, "--ckpt-every and --resume need --ckpt-dir DIR");
    if (f->beta1 < 0 || f->beta1 >= 1 || f->beta2 < 0 || f->beta2 >= 1)
        lib_fail_all(2, "--beta1 and --beta2 must be in [0, 1)");
    if (f->exit_grace < 0 || f->exit_minutes < 0)
        lib_fail_all(2, "--exit-grace and --exit-duration-in-mins must be >= 0");
    if ((f->exit_minutes > 0 || f->exit_interval) && !f->ckpt_dir)
        lib_fail_all(2, "--exit-duration-in-mins and --exit-interval save a checkpoint to "
                     "resume from: they need --ckpt-dir DIR");
}
