/*
** lr.c: the learning-rate schedule of lr.h. Pure: no state, no I/O, no runtime. The flags it
** reads are the ones lib_flags_parse accepted (0 <= min-lr <= lr, warm-up <= decay steps, WSD's
** decay inside the decay steps); tests/lr checks every style against Megatron's scheduler.
*/
#define _GNU_SOURCE   /* M_PI */
#include <math.h>

#include "lr.h"

/*
** Learning rate of the optimizer step that follows 'done' completed steps (step t = done + 1
** of the log): Megatron's OptimizerParamScheduler, evaluated once before the first step and
** advanced after each. As Megatron's iteration-based training, it counts samples: n = done*G,
** with warm-up, decay and WSD-decay lengths in samples too (G = 'gbs', the global batch in
** sequences). The samples cancel in every ratio; they matter only to inverse-square-root
** without warm-up (max(W, 1) is 1 sample, not 1 step). The operations and their order are
** Megatron's, so the double is the one Megatron computes.
*/
double lib_lr(const lib_flags *f, long long gbs, int done)
{
    long long g = gbs, n = done * g, w = f->warmup * g, s = f->decay_steps * g;
    double max_lr = f->lr, min_lr = f->min_lr, coeff;

    if (w > 0 && n <= w) return f->lr_init + (max_lr - f->lr_init) * (double)n / (double)w;
    if (f->lr_style == LR_CONSTANT) return max_lr;
    if (n > s) return min_lr;
    if (f->lr_style == LR_INVERSE_SQRT) {
        double lr = max_lr * pow((double)(w > 1 ? w : 1), 0.5) /
                    pow((double)(n > 1 ? n : 1), 0.5);
        return min_lr >= lr ? min_lr : lr;
    }
    double ratio = (double)(n - w) / (double)(s - w);
    if (f->lr_style == LR_LINEAR) coeff = 1.0 - ratio;
    else if (f->lr_style == LR_COSINE) coeff = 0.5 * (cos(M_PI * ratio) + 1.0);
    else {                                  /* WSD: stable, then the last wsd_iters decay */
        long long wsd = f->wsd_iters * g, stable = s - wsd;
        if (n <= stable) coeff = 1.0;
        else {
            double r = (double)(n - stable) / (double)wsd;
            switch (f->wsd_style) {
            case WSD_LINEAR:      coeff = 1.0 - r; break;
            case WSD_COSINE:      coeff = 0.5 * (cos(M_PI * r) + 1.0); break;
            case WSD_MINUS_SQRT:  coeff = 1.0 - sqrt(r); break;
            default:              coeff = 2.0 * pow(0.5, r) - 1.0; break;
            }
        }
    }
    return min_lr + coeff * (max_lr - min_lr);
}
