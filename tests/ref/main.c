/*
** main.c: the command line of build/ref/gpt2_ref, the double-precision reference trainer.
** Parses and checks flags, builds the model (GPT-2, or Llama with --arch llama; --init or
** --random-init; dense, or a mixture of experts with --experts), trains on --data with the
** fixed batching (tests/ref/README.md), and writes the log and checkpoints. All math is in
** gpt2_ref.c, all file formats in ref_io.c. Exit codes: 0 ok, 1 bad input file or I/O error,
** 2 usage error.
*/
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_ref.h"   // defines: ref_model, ref_train_step, ref_optim, ref_lr
#include "ref_io.h"     // defines: ref_model_load, ref_model_save, ref_data_load, ref_data_batch

#define PROG "gpt2_ref"

static const char usage_text[] =
    "usage: " PROG " --layers L --hidden C --heads H --seq T --vocab V [--ffn F]\n"
    "                [--arch gpt2|llama] [--kv-heads K] [--rope-theta X] [--tie-embeddings]\n"
    "                [--norm-eps X] [--no-linear-bias]\n"
    "                [--experts E --top-k K [--expert-ffn F] [--expert-bias] [--router-bias]\n"
    "                 [--shared-expert-ffn F]\n"
    "                 [--aux-coeff X] [--z-coeff X] [--load-balancing T] [--topk-scale X]\n"
    "                 [--score-function F] [--num-groups G --group-topk g]\n"
    "                 [--bias-update-rate X] [--pre-softmax]\n"
    "                 [--capacity X [--drop-policy P] [--router-shards S] [--router-cp P]\n"
    "                 [--pad-to-capacity]]]\n"
    "                (--init FILE.safetensors | --random-init SEED)\n"
    "                [--data FILE --steps N] [--mbs B] [--nmb M] [--dp D]\n"
    "                [--lr X] [--min-lr X] [--warmup N] [--decay-steps N]\n"
    "                [--lr-decay-style S] [--lr-warmup-init X]\n"
    "                [--lr-wsd-decay-style S --lr-wsd-decay-iters N]\n"
    "                [--beta1 X] [--beta2 X] [--eps X] [--wd X] [--clip X]\n"
    "                [--log FILE.jsonl] [--save FILE.safetensors] [--save-init FILE.safetensors]\n"
    "\n"
    "Double-precision reference GPT-2 / Llama trainer (the oracle for generated programs).\n"
    "  --ffn F            MLP width (default 4*C; with --arch llama the SwiGLU width, required\n"
    "                     unless --experts)\n"
    "  --arch A           gpt2 (default: GPT2LMHeadModel) or llama (LlamaForCausalLM; with\n"
    "                     --experts MixtralForCausalLM): RMSNorm, rope, GQA, SwiGLU, no biases\n"
    "    --kv-heads K       key/value heads, dividing H (default H)\n"
    "    --rope-theta X     rotary base (default 10000)\n"
    "    --tie-embeddings   lm_head is embed_tokens (default: a separate lm_head.weight)\n"
    "  --norm-eps X       LayerNorm / RMSNorm eps (default 1e-5)\n"
    "  --no-linear-bias   gpt2: no biases in c_attn, c_proj, c_fc (Megatron's\n"
    "                     --disable-bias-linear; the LayerNorms keep theirs)\n"
    "  --experts E        every MLP is a mixture of E experts (Megatron's MoE), with\n"
    "    --top-k K          experts per token (1..E), router softmax over the top-k logits\n"
    "    --expert-ffn F     width of each expert's MLP (default --ffn)\n"
    "    --shared-expert-ffn F  a shared expert: the model's MLP of width F on every token,\n"
    "                       added to the routed output (Megatron's\n"
    "                       --moe-shared-expert-intermediate-size, no gate)\n"
    "    --expert-bias      experts' c_fc and c_proj have biases (default: none; gpt2 only)\n"
    "    --router-bias      the router has a bias, mlp.router.bias (gpt2 only; Megatron's\n"
    "                       router with add_bias_linear)\n"
    "    --aux-coeff X      load-balancing loss coefficient (default 0: off)\n"
    "    --z-coeff X        router z-loss coefficient (Megatron's --moe-z-loss-coeff; 0: off)\n"
    "    --score-function F softmax (default) or sigmoid (Megatron's\n"
    "                       --moe-router-score-function)\n"
    "    --num-groups G --group-topk g  group-limited routing: the top-k from the g best of\n"
    "                       G expert groups (Megatron's --moe-router-num-groups/-group-topk)\n"
    "    --bias-update-rate X  aux-loss-free balancing: an expert bias (state, saved as\n"
    "                       h.{i}.mlp.router.expert_bias) on the sigmoids for the top-k, after\n"
    "                       each step += X * sign(mean - count) (Megatron's\n"
    "                       --moe-router-enable-expert-bias; needs --score-function sigmoid)\n"
    "    --topk-scale X     factor of the chosen probabilities (Megatron's\n"
    "                       --moe-router-topk-scaling-factor; default none)\n"
    "    --load-balancing T aux_loss (default: per micro-batch), seq_aux_loss (per sequence,\n"
    "                       averaged over the micro-batch's) or none\n"
    "    --pre-softmax      softmax over all E experts, then top-k (not renormalised)\n"
    "    --capacity X       capacity factor: drop tokens beyond ceil(N*K/E*X) per expert\n"
    "    --drop-policy P    probs (default: keep the highest probabilities) or position\n"
    "    --router-shards S  route each micro-batch as S blocks of SEQ/S positions, each\n"
    "                       with its own capacity (a TP = S rank's tokens under SP)\n"
    "    --router-cp P      first split the positions over P cp ranks (chunks c, 2P-1-c)\n"
    "    --pad-to-capacity  the expert bias counts min(capacity, tokens) rows per expert and\n"
    "                       router call (the padded rows; nothing else changes)\n"
    "  --init FILE        load weights (Hugging Face GPT-2 or Llama names; F32, BF16, F16, F64)\n"
    "  --random-init SEED N(0,0.02) weights, c_proj (o_proj, down_proj, w2) N(0,0.02/sqrt(2L)),\n"
    "                     biases 0, LN 1/0, RMSNorm 1\n"
    "  --data FILE        uint16 tokens (nanoGPT .bin) or llm.c shard (magic 20240520)\n"
    "  --steps N          optimizer steps (default 0: only load/init and save)\n"
    "  --mbs B --nmb M --dp D   global batch = B*M*D sequences per step (default 1 1 1)\n"
    "  --lr 6e-4 --min-lr 0.1*lr --warmup 0 --decay-steps max(steps,warmup)\n"
    "                     Megatron's schedule (tests/ref/README.md); --warmup and\n"
    "                     --decay-steps are its --lr-warmup-iters and --lr-decay-iters, and\n"
    "                     its --min-lr defaults to 0\n"
    "  --lr-decay-style S constant, linear, cosine (default), inverse-square-root or WSD\n"
    "  --lr-warmup-init X the rate of the first warm-up step (default 0)\n"
    "  --lr-wsd-decay-iters N    WSD: the last N of the decay steps decay (required)\n"
    "  --lr-wsd-decay-style S    WSD: exponential (default), linear, cosine or minus_sqrt\n"
    "  --beta1 0.9 --beta2 0.95 --eps 1e-8 --wd 0.1 --clip 1.0 (0: no clipping)\n"
    "  --log FILE         one JSON object per step: step, loss, [aux_loss,] lr, grad_norm\n"
    "  --save FILE        F32 weights after the last step; --save-init FILE: before the first\n"
    "  --generate N --prompt-ids LIST [--gen-logits FILE]\n"
    "                     after the steps: N tokens greedily after the prompt (ids separated\n"
    "                     by commas), each from a whole forward pass over the sequence so far\n"
    "                     (no cache); prints 'tokens: ' and the whole sequence; FILE gets the\n"
    "                     logits each new token was chosen from, f64 rows of V\n";

typedef struct options {
    ref_config cfg;
    const char *init, *data, *log, *save, *save_init;
    int have_seed;
    unsigned long long seed;
    int steps, mbs, nmb, dp;
    int have_min_lr, have_decay_steps, have_wsd_steps;
    const char *wsd_flag;       /* the first WSD-only flag given, to report it without WSD */
    const char *moe_flag;       /* the first MoE flag given, to report it without --experts */
    const char *llama_flag;     /* the first Llama-only flag given, to report it with gpt2 */
    int have_experts, have_top_k, have_capacity;
    int have_drop;              /* --drop-policy or --router-shards given (need --capacity) */
    int lb_none;                /* --load-balancing none: no aux loss whatever --aux-coeff */
    ref_optim opt;
    int have_generate, gen_new;     /* --generate N: greedy, N new tokens after --prompt-ids */
    const char *prompt_ids, *gen_logits;
} options;

/* -- Argument parsing -------------------------------------------------------------------------- */

static int usage_error(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, PROG ": error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(" PROG " --help for usage)\n");
    return -1;
}

static int parse_int(const char *flag, const char *s, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno != 0 || x < -2147483647L || x > 2147483647L)
        return usage_error("%s expects an integer, got '%s'", flag, s);
    *out = (int)x;
    return 0;
}

static int parse_double(const char *flag, const char *s, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || errno != 0)
        return usage_error("%s expects a number, got '%s'", flag, s);
    *out = x;
    return 0;
}

static int parse_seed(const char *flag, const char *s, unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (*s == '\0' || *s == '-' || *end != '\0' || errno != 0)
        return usage_error("%s expects a non-negative integer, got '%s'", flag, s);
    *out = x;
    return 0;
}

/* The index of s in names[0..n), or a usage error that lists them. */
static int parse_name(const char *flag, const char *s, const char *const *names, int n,
                      int *out)
{
    char list[160] = "";
    for (int k = 0; k < n; k++) {
        if (strcmp(s, names[k]) == 0) {
            *out = k;
            return 0;
        }
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                 k == 0 ? "" : k == n - 1 ? " or " : ", ", names[k]);
    }
    return usage_error("%s must be %s, got '%s'", flag, list, s);
}

/* ORDER ref_lr_style, ref_wsd_style (gpt2_ref.h) */
static const char *const lr_styles[] = {"cosine", "constant", "linear", "inverse-square-root",
                                        "WSD"};
static const char *const wsd_styles[] = {"exponential", "linear", "cosine", "minus_sqrt"};

static int parse_arch(const char *s, ref_arch *out)
{
    if (strcmp(s, "gpt2") == 0)
        *out = REF_ARCH_GPT2;
    else if (strcmp(s, "llama") == 0)
        *out = REF_ARCH_LLAMA;
    else
        return usage_error("--arch must be gpt2 or llama, got '%s'", s);
    return 0;
}

/* Fill *o from argv. Returns 0, 1 for --help, -1 after a usage error. */
static int parse_args(options *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    o->cfg.ln_eps = 1e-5;
    o->cfg.rope_theta = 10000.0;
    o->cfg.moe.drop_probs = 1;          /* Megatron's default drop policy */
    o->mbs = o->nmb = o->dp = 1;
    o->opt = (ref_optim){.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .wd = 0.1,
                         .clip = 1.0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return 1;
        if (strcmp(a, "--expert-bias") == 0 || strcmp(a, "--pre-softmax") == 0) {
            if (a[2] == 'e')
                o->cfg.moe.bias = 1;
            else
                o->cfg.moe.pre_softmax = 1;
            if (o->moe_flag == NULL)
                o->moe_flag = a;
            continue;
        }
        if (strcmp(a, "--pad-to-capacity") == 0) {
            o->cfg.moe.pad = 1;
            o->have_drop = 1;
            continue;
        }
        if (strcmp(a, "--router-bias") == 0) {
            o->cfg.moe.router_bias = 1;
            if (o->moe_flag == NULL)
                o->moe_flag = a;
            continue;
        }
        if (strcmp(a, "--no-linear-bias") == 0) {
            o->cfg.no_linear_bias = 1;
            continue;
        }
        if (strcmp(a, "--tie-embeddings") == 0) {
            o->cfg.tie_embeddings = 1;
            if (o->llama_flag == NULL)
                o->llama_flag = a;
            continue;
        }
        if (i + 1 >= argc)
            return usage_error("%s", strncmp(a, "--", 2) == 0 ? "missing value after the flag"
                                                             : "unexpected argument");
        const char *v = argv[++i];
        int rc;
        if (strcmp(a, "--layers") == 0) rc = parse_int(a, v, &o->cfg.layers);
        else if (strcmp(a, "--hidden") == 0) rc = parse_int(a, v, &o->cfg.hidden);
        else if (strcmp(a, "--heads") == 0) rc = parse_int(a, v, &o->cfg.heads);
        else if (strcmp(a, "--seq") == 0) rc = parse_int(a, v, &o->cfg.seq);
        else if (strcmp(a, "--vocab") == 0) rc = parse_int(a, v, &o->cfg.vocab);
        else if (strcmp(a, "--ffn") == 0) rc = parse_int(a, v, &o->cfg.ffn);
        else if (strcmp(a, "--arch") == 0) rc = parse_arch(v, &o->cfg.arch);
        else if (strcmp(a, "--kv-heads") == 0) rc = parse_int(a, v, &o->cfg.kv_heads);
        else if (strcmp(a, "--rope-theta") == 0) rc = parse_double(a, v, &o->cfg.rope_theta);
        else if (strcmp(a, "--norm-eps") == 0) rc = parse_double(a, v, &o->cfg.ln_eps);
        else if (strcmp(a, "--experts") == 0) rc = (o->have_experts = 1,
                                                    parse_int(a, v, &o->cfg.moe.experts));
        else if (strcmp(a, "--top-k") == 0) rc = (o->have_top_k = 1,
                                                  parse_int(a, v, &o->cfg.moe.top_k));
        else if (strcmp(a, "--expert-ffn") == 0) rc = parse_int(a, v, &o->cfg.moe.ffn);
        else if (strcmp(a, "--shared-expert-ffn") == 0)
            rc = parse_int(a, v, &o->cfg.moe.shared_ffn);
        else if (strcmp(a, "--aux-coeff") == 0) rc = parse_double(a, v, &o->cfg.moe.aux_coeff);
        else if (strcmp(a, "--z-coeff") == 0) rc = parse_double(a, v, &o->cfg.moe.z_coeff);
        else if (strcmp(a, "--topk-scale") == 0) rc = parse_double(a, v, &o->cfg.moe.topk_scale);
        else if (strcmp(a, "--bias-update-rate") == 0)
            rc = parse_double(a, v, &o->cfg.moe.bias_rate);
        else if (strcmp(a, "--num-groups") == 0) rc = parse_int(a, v, &o->cfg.moe.groups);
        else if (strcmp(a, "--group-topk") == 0) rc = parse_int(a, v, &o->cfg.moe.group_topk);
        else if (strcmp(a, "--score-function") == 0) {
            if (strcmp(v, "softmax") != 0 && strcmp(v, "sigmoid") != 0)
                return usage_error("--score-function must be softmax or sigmoid (got '%s')", v);
            o->cfg.moe.sigmoid = strcmp(v, "sigmoid") == 0;
            if (o->moe_flag == NULL)
                o->moe_flag = a;
        }
        else if (strcmp(a, "--load-balancing") == 0) {
            if (strcmp(v, "aux_loss") != 0 && strcmp(v, "seq_aux_loss") != 0 &&
                strcmp(v, "none") != 0)
                return usage_error("--load-balancing must be aux_loss, seq_aux_loss or none "
                                   "(got '%s')", v);
            o->cfg.moe.seq_aux = strcmp(v, "seq_aux_loss") == 0;
            o->lb_none = strcmp(v, "none") == 0;
            if (o->moe_flag == NULL)
                o->moe_flag = a;
        }
        else if (strcmp(a, "--capacity") == 0) rc = (o->have_capacity = 1,
                                                     parse_double(a, v, &o->cfg.moe.capacity));
        else if (strcmp(a, "--drop-policy") == 0) {
            o->have_drop = 1;
            if (strcmp(v, "probs") != 0 && strcmp(v, "position") != 0)
                return usage_error("--drop-policy must be probs or position (got '%s')", v);
            o->cfg.moe.drop_probs = strcmp(v, "probs") == 0;
        }
        else if (strcmp(a, "--router-shards") == 0) rc = (o->have_drop = 1,
                                                          parse_int(a, v, &o->cfg.moe.shards));
        else if (strcmp(a, "--router-cp") == 0) rc = (o->have_drop = 1,
                                                      parse_int(a, v, &o->cfg.moe.cp_shards));
        else if (strcmp(a, "--init") == 0) rc = (o->init = v, 0);
        else if (strcmp(a, "--random-init") == 0) rc = (o->have_seed = 1,
                                                        parse_seed(a, v, &o->seed));
        else if (strcmp(a, "--data") == 0) rc = (o->data = v, 0);
        else if (strcmp(a, "--steps") == 0) rc = parse_int(a, v, &o->steps);
        else if (strcmp(a, "--mbs") == 0) rc = parse_int(a, v, &o->mbs);
        else if (strcmp(a, "--nmb") == 0) rc = parse_int(a, v, &o->nmb);
        else if (strcmp(a, "--dp") == 0) rc = parse_int(a, v, &o->dp);
        else if (strcmp(a, "--lr") == 0) rc = parse_double(a, v, &o->opt.lr);
        else if (strcmp(a, "--min-lr") == 0) rc = (o->have_min_lr = 1,
                                                   parse_double(a, v, &o->opt.min_lr));
        else if (strcmp(a, "--warmup") == 0) rc = parse_int(a, v, &o->opt.warmup);
        else if (strcmp(a, "--decay-steps") == 0) rc = (o->have_decay_steps = 1,
                                                        parse_int(a, v, &o->opt.decay_steps));
        else if (strcmp(a, "--lr-warmup-init") == 0) rc = parse_double(a, v, &o->opt.lr_init);
        else if (strcmp(a, "--lr-decay-style") == 0) {
            int k = 0;
            rc = parse_name(a, v, lr_styles, 5, &k);
            o->opt.style = (ref_lr_style)k;
        } else if (strcmp(a, "--lr-wsd-decay-style") == 0) {
            int k = 0;
            rc = parse_name(a, v, wsd_styles, 4, &k);
            o->opt.wsd_style = (ref_wsd_style)k;
            o->wsd_flag = o->wsd_flag ? o->wsd_flag : a;
        } else if (strcmp(a, "--lr-wsd-decay-iters") == 0) {
            o->have_wsd_steps = 1;
            rc = parse_int(a, v, &o->opt.wsd_steps);
            o->wsd_flag = o->wsd_flag ? o->wsd_flag : a;
        }
        else if (strcmp(a, "--beta1") == 0) rc = parse_double(a, v, &o->opt.beta1);
        else if (strcmp(a, "--beta2") == 0) rc = parse_double(a, v, &o->opt.beta2);
        else if (strcmp(a, "--eps") == 0) rc = parse_double(a, v, &o->opt.eps);
        else if (strcmp(a, "--wd") == 0) rc = parse_double(a, v, &o->opt.wd);
        else if (strcmp(a, "--clip") == 0) rc = parse_double(a, v, &o->opt.clip);
        else if (strcmp(a, "--log") == 0) rc = (o->log = v, 0);
        else if (strcmp(a, "--save") == 0) rc = (o->save = v, 0);
        else if (strcmp(a, "--save-init") == 0) rc = (o->save_init = v, 0);
        else if (strcmp(a, "--generate") == 0) rc = (o->have_generate = 1,
                                                     parse_int(a, v, &o->gen_new));
        else if (strcmp(a, "--prompt-ids") == 0) rc = (o->prompt_ids = v, 0);
        else if (strcmp(a, "--gen-logits") == 0) rc = (o->gen_logits = v, 0);
        else return usage_error("unknown flag '%s'", a);
        if (rc < 0)
            return -1;
        if (o->moe_flag == NULL && strcmp(a, "--experts") != 0 &&
            (strcmp(a, "--top-k") == 0 || strcmp(a, "--expert-ffn") == 0 ||
             strcmp(a, "--shared-expert-ffn") == 0 ||
             strcmp(a, "--aux-coeff") == 0 || strcmp(a, "--capacity") == 0 ||
             strcmp(a, "--z-coeff") == 0 || strcmp(a, "--topk-scale") == 0 ||
             strcmp(a, "--num-groups") == 0 || strcmp(a, "--group-topk") == 0))
            o->moe_flag = a;
        if (o->llama_flag == NULL &&
            (strcmp(a, "--kv-heads") == 0 || strcmp(a, "--rope-theta") == 0))
            o->llama_flag = a;
    }
    return 0;
}

/* Check the mixture-of-experts flags (all need --experts) and default --expert-ffn to --ffn. */
static int check_moe_args(options *o)
{
    ref_moe_config *moe = &o->cfg.moe;
    if (!o->have_experts) {
        if (o->moe_flag != NULL)
            return usage_error("%s needs --experts", o->moe_flag);
        return 0;
    }
    if (moe->experts < 1)
        return usage_error("--experts must be >= 1 (got %d)", moe->experts);
    if (!o->have_top_k)
        return usage_error("--top-k is required with --experts");
    if (moe->top_k < 1 || moe->top_k > moe->experts)
        return usage_error("--top-k (%d) must be between 1 and --experts (%d)", moe->top_k,
                           moe->experts);
    if (moe->top_k == 1 && !moe->pre_softmax && !moe->sigmoid)  /* as Megatron's config */
        return usage_error("--top-k 1 needs --pre-softmax (a softmax over one logit is 1: "
                           "no router gradient)");
    if (moe->bias && o->cfg.arch == REF_ARCH_LLAMA)
        return usage_error("--expert-bias needs --arch gpt2 (Mixtral experts have no biases)");
    if (moe->router_bias && o->cfg.arch == REF_ARCH_LLAMA)
        return usage_error("--router-bias needs --arch gpt2 (Mixtral's gate has no bias)");
    if (moe->ffn == 0)
        moe->ffn = o->cfg.ffn;
    if (moe->ffn == 0)
        return usage_error("--expert-ffn (or --ffn) is required with --arch llama --experts");
    if (moe->ffn < 1)
        return usage_error("--expert-ffn must be >= 1 (got %d)", moe->ffn);
    if (moe->shared_ffn < 0)
        return usage_error("--shared-expert-ffn must be >= 1 (got %d)", moe->shared_ffn);
    if (!(moe->aux_coeff >= 0.0))
        return usage_error("--aux-coeff must be >= 0");
    if (!(moe->z_coeff >= 0.0))
        return usage_error("--z-coeff must be >= 0");
    if (!(moe->topk_scale >= 0.0))
        return usage_error("--topk-scale must be > 0");
    if ((moe->groups > 0) != (moe->group_topk > 0))
        return usage_error("--num-groups and --group-topk go together");
    if (moe->groups > 0 && (moe->experts % moe->groups != 0 || moe->group_topk > moe->groups ||
                            moe->group_topk * (moe->experts / moe->groups) < moe->top_k))
        return usage_error("--num-groups must divide --experts, and --group-topk (<= "
                           "--num-groups) groups must hold --top-k experts");
    if (o->lb_none)             /* Megatron: no load-balancing loss of any type */
        moe->aux_coeff = 0.0;
    if (o->have_capacity && !(moe->capacity > 0.0))
        return usage_error("--capacity must be > 0");
    if (o->have_drop && !o->have_capacity)
        return usage_error("--drop-policy, --router-shards, --router-cp and --pad-to-capacity "
                           "need --capacity");
    if (!(moe->bias_rate >= 0.0))
        return usage_error("--bias-update-rate must be > 0");
    if (moe->bias_rate > 0.0 && !moe->sigmoid)      /* as Megatron's config */
        return usage_error("--bias-update-rate needs --score-function sigmoid (Megatron: "
                           "expert bias only with sigmoid scores)");
    int rs = moe->shards > 1 ? moe->shards : 1;
    int rcp = moe->cp_shards > 1 ? 2 * moe->cp_shards : 1;
    if (moe->shards < 0 || moe->cp_shards < 0 || o->cfg.seq % (rs * rcp) != 0)
        return usage_error("--router-shards (%d) times 2 --router-cp (%d) must divide --seq "
                           "(%d)", moe->shards, moe->cp_shards, o->cfg.seq);
    return 0;
}

/* Check the Llama options (--arch llama) and fill in their defaults; the Llama-only flags are
** an error with --arch gpt2. Called before the MoE check: --ffn stays 0 if not given. */
static int check_llama_args(options *o)
{
    ref_config *c = &o->cfg;
    if (c->arch != REF_ARCH_LLAMA) {
        if (o->llama_flag != NULL)
            return usage_error("%s needs --arch llama", o->llama_flag);
        return 0;
    }
    if (c->kv_heads == 0)
        c->kv_heads = c->heads;
    if (c->kv_heads < 1)
        return usage_error("--kv-heads must be >= 1 (got %d)", c->kv_heads);
    if (c->heads % c->kv_heads != 0)
        return usage_error("--kv-heads (%d) must divide --heads (%d)", c->kv_heads, c->heads);
    if ((c->hidden / c->heads) % 2 != 0)
        return usage_error("--arch llama needs an even head dim (--hidden / --heads = %d) for "
                           "rope", c->hidden / c->heads);
    if (!(c->rope_theta > 0.0))
        return usage_error("--rope-theta must be > 0");
    if (c->ffn == 0 && !o->have_experts)
        return usage_error("--ffn is required with --arch llama");
    return 0;
}

/* Check the options and fill in the defaults that depend on others. */
static int check_args(options *o)
{
    ref_config *c = &o->cfg;
    static const char *const dims[] = {"--layers", "--hidden", "--heads", "--seq", "--vocab"};
    const int vals[] = {c->layers, c->hidden, c->heads, c->seq, c->vocab};
    for (int i = 0; i < 5; i++)
        if (vals[i] < 1)
            return usage_error(vals[i] == 0 ? "%s is required" : "%s must be >= 1 (got %d)",
                               dims[i], vals[i]);
    if (c->hidden % c->heads != 0)
        return usage_error("--heads (%d) must divide --hidden (%d)", c->heads, c->hidden);
    if (c->vocab > 65536)
        return usage_error("--vocab (%d) must be <= 65536 (tokens are uint16)", c->vocab);
    if (!(c->ln_eps > 0.0))
        return usage_error("--norm-eps must be > 0");
    if (check_llama_args(o) < 0)
        return -1;
    if (c->ffn == 0 && c->arch == REF_ARCH_GPT2)
        c->ffn = 4 * c->hidden;
    if (c->ffn < 0)
        return usage_error("--ffn must be >= 1 (got %d)", c->ffn);
    if (check_moe_args(o) < 0)
        return -1;
    if (c->ffn == 0)
        c->ffn = c->moe.ffn;    /* a Llama MoE has no dense MLP: any width >= 1 will do */
    if (o->have_generate && (o->gen_new < 1 || o->prompt_ids == NULL))
        return usage_error("--generate N needs N >= 1 and --prompt-ids LIST");
    if ((o->init != NULL) == o->have_seed)
        return usage_error("give exactly one of --init FILE and --random-init SEED");
    if (o->steps < 0)
        return usage_error("--steps must be >= 0 (got %d)", o->steps);
    if (o->steps > 0 && o->data == NULL)
        return usage_error("--data is required when --steps > 0");
    if (o->mbs < 1 || o->nmb < 1 || o->dp < 1)
        return usage_error("--mbs, --nmb and --dp must be >= 1");
    if ((long long)o->mbs * o->nmb * o->dp * c->seq > 100000000LL)
        return usage_error("global batch of %d x %d x %d sequences of %d is too large", o->mbs,
                           o->nmb, o->dp, c->seq);

    ref_optim *p = &o->opt;
    if (!o->have_min_lr)
        p->min_lr = 0.1 * p->lr;
    if (p->warmup < 0)
        return usage_error("--warmup must be >= 0 (got %d)", p->warmup);
    if (!o->have_decay_steps)
        p->decay_steps = o->steps > p->warmup ? o->steps : p->warmup;
    if (p->decay_steps < p->warmup)
        return usage_error("--decay-steps (%d) must be >= --warmup (%d)", p->decay_steps,
                           p->warmup);
    if (o->steps > 0 && p->decay_steps < 1)
        return usage_error("--decay-steps must be >= 1 (the step count after which the rate "
                           "is min-lr)");
    if (p->lr < 0 || p->min_lr < 0)
        return usage_error("--lr and --min-lr must be >= 0");
    if (p->min_lr > p->lr)
        return usage_error("--min-lr (%g) must be <= --lr (%g)", p->min_lr, p->lr);
    if (p->lr_init > p->lr)
        return usage_error("--lr-warmup-init (%g) must be <= --lr (%g)", p->lr_init, p->lr);
    if (p->style != REF_LR_WSD && o->wsd_flag != NULL)
        return usage_error("%s needs --lr-decay-style WSD", o->wsd_flag);
    if (p->style == REF_LR_WSD && !o->have_wsd_steps)
        return usage_error("--lr-decay-style WSD needs --lr-wsd-decay-iters N (the number of "
                           "steps of its final decay)");
    if (p->style == REF_LR_WSD && (p->wsd_steps < 0 || p->wsd_steps > p->decay_steps))
        return usage_error("--lr-wsd-decay-iters (%d) must be in [0, --decay-steps (%d)]",
                           p->wsd_steps, p->decay_steps);
    p->gbs = o->mbs * o->nmb * o->dp;
    if (p->beta1 < 0 || p->beta1 >= 1 || p->beta2 < 0 || p->beta2 >= 1)
        return usage_error("--beta1 and --beta2 must be in [0, 1)");
    if (p->eps <= 0)
        return usage_error("--eps must be > 0");
    if (p->wd < 0 || p->clip < 0)
        return usage_error("--wd and --clip must be >= 0");
    return 0;
}

/* -- Training ---------------------------------------------------------------------------------- */

/* Train o->steps steps; returns 0 or -1 after reporting an I/O error. */
static int train(ref_model *m, const options *o)
{
    ref_data data;
    if (ref_data_load(&data, o->data, o->cfg.vocab, o->cfg.seq) < 0)
        return -1;
    FILE *log = NULL;
    if (o->log != NULL && (log = fopen(o->log, "w")) == NULL) {
        fprintf(stderr, "%s: error: cannot write: %s\n", o->log, strerror(errno));
        ref_data_free(&data);
        return -1;
    }
    int gbs = o->mbs * o->nmb * o->dp, T = o->cfg.seq;
    int *inputs = ref_xmalloc((size_t)gbs * T * sizeof(int));
    int *targets = ref_xmalloc((size_t)gbs * T * sizeof(int));
    ref_acts *acts = ref_acts_new(&o->cfg, o->mbs);
    printf(PROG ": %zu tokens, %zu samples (%s); global batch %d = mbs %d x nmb %d x dp %d\n",
           data.ntokens, data.nsamples, data.is_shard ? "llm.c shard" : "uint16 tokens", gbs,
           o->mbs, o->nmb, o->dp);

    int rc = 0;
    for (int s = 0; s < o->steps; s++) {
        ref_data_batch(&data, s, gbs, inputs, targets);
        ref_step_info st = ref_train_step(m, acts, &o->opt, inputs, targets, gbs);
        int moe = o->cfg.moe.experts > 0;
        printf("step %4d/%d | loss %.6f", st.step, o->steps, st.loss);
        if (moe)
            printf(" | aux %.6f", st.aux_loss);
        printf(" | lr %.4e | grad_norm %.6f\n", st.lr, st.grad_norm);
        if (log != NULL) {
            fprintf(log, "{\"step\":%d,\"loss\":%.17g,", st.step, st.loss);
            if (moe)
                fprintf(log, "\"aux_loss\":%.17g,", st.aux_loss);
            fprintf(log, "\"lr\":%.17g,\"grad_norm\":%.17g}\n", st.lr, st.grad_norm);
        }
    }
    fflush(stdout);
    if (log != NULL && fclose(log) != 0) {
        fprintf(stderr, "%s: error: write failed\n", o->log);
        rc = -1;
    }
    ref_acts_free(acts, &o->cfg);
    free(inputs);
    free(targets);
    ref_data_free(&data);
    return rc;
}

/* -- Generation ------------------------------------------------------------------------------- */

/*
** Greedy generation, written for clarity: the prompt's ids, then o->gen_new times the whole
** forward pass over the sequence so far (the rest of the T positions are padding, which the
** causal mask keeps from the earlier positions), the logits of its last position (final norm
** row times lm_head) and their first maximum. Prints the sequence; --gen-logits gets each
** chosen-from row (f64). Returns 0, or -1 after reporting an error.
*/
static int generate(const ref_model *m, const options *o)
{
    const ref_config *c = &m->cfg;
    int T = c->seq, V = c->vocab, C = c->hidden, n = 0;
    int *seq = ref_xcalloc((size_t)T, sizeof *seq), *targets = ref_xcalloc((size_t)T, sizeof *seq);
    for (const char *s = o->prompt_ids; ; ) {
        char *end;
        long id = strtol(s, &end, 10);
        if (end == s || (*end && *end != ',') || id < 0 || id >= V || n >= T) {
            free(seq);
            free(targets);
            return usage_error("--prompt-ids: bad list '%s' (ids in [0, %d), fewer than %d)",
                               o->prompt_ids, V, T);
        }
        seq[n++] = (int)id;
        if (!*end) break;
        s = end + 1;
    }
    if (n + o->gen_new > T) {
        free(seq);
        free(targets);
        return usage_error("the prompt (%d) and --generate %d exceed --seq %d", n, o->gen_new, T);
    }
    FILE *lf = o->gen_logits ? fopen(o->gen_logits, "wb") : NULL;
    if (o->gen_logits && !lf) {
        fprintf(stderr, PROG ": %s: cannot create: %s\n", o->gen_logits, strerror(errno));
        free(seq);
        free(targets);
        return -1;
    }
    ref_acts *a = ref_acts_new(c, 1);
    double *logits = ref_xmalloc((size_t)V * sizeof *logits);
    for (int k = 0; k < o->gen_new; k++) {
        ref_forward(m, a, seq, targets);
        ref_head_fwd(logits, a->lnf + (size_t)(n - 1) * C, m->w.lm_head, 1, V, C);
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        seq[n++] = best;
        if (lf && fwrite(logits, sizeof *logits, (size_t)V, lf) != (size_t)V) break;
    }
    int rc = 0;
    if (lf && (ferror(lf) | fclose(lf))) {
        fprintf(stderr, PROG ": %s: write failed\n", o->gen_logits);
        rc = -1;
    }
    printf("tokens:");
    for (int i = 0; i < n; i++) printf(" %d", seq[i]);
    printf("\n");
    free(logits);
    ref_acts_free(a, c);
    free(seq);
    free(targets);
    return rc;
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_args(&o, argc, argv);
    if (rc == 1) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (rc < 0 || check_args(&o) < 0)
        return 2;

    ref_model *m = ref_model_new(&o.cfg);
    const ref_moe_config *moe = &o.cfg.moe;
    if (o.cfg.arch == REF_ARCH_LLAMA)
        printf(PROG ": arch llama layers %d hidden %d heads %d kv-heads %d seq %d vocab %d "
               "rope-theta %g norm-eps %g%s ", o.cfg.layers, o.cfg.hidden, o.cfg.heads,
               o.cfg.kv_heads, o.cfg.seq, o.cfg.vocab, o.cfg.rope_theta, o.cfg.ln_eps,
               o.cfg.tie_embeddings ? " tied" : "");
    else
        printf(PROG ": layers %d hidden %d heads %d seq %d vocab %d ", o.cfg.layers,
               o.cfg.hidden, o.cfg.heads, o.cfg.seq, o.cfg.vocab);
    if (moe->experts > 0) {
        printf("experts %d top-k %d expert-ffn %d%s%s aux-coeff %g%s", moe->experts,
               moe->top_k, moe->ffn, moe->bias ? " expert-bias" : "",
               moe->router_bias ? " router-bias" : "", moe->aux_coeff,
               moe->pre_softmax ? " pre-softmax" : "");
        if (moe->z_coeff > 0)
            printf(" z-coeff %g", moe->z_coeff);
        if (moe->seq_aux)
            printf(" seq-aux-loss");
        if (moe->topk_scale > 0)
            printf(" topk-scale %g", moe->topk_scale);
        if (moe->sigmoid)
            printf(" sigmoid");
        if (moe->bias_rate > 0)
            printf(" bias-update-rate %g", moe->bias_rate);
        if (moe->groups > 0)
            printf(" groups %d group-topk %d", moe->groups, moe->group_topk);
        if (moe->shared_ffn > 0)
            printf(" shared-expert-ffn %d", moe->shared_ffn);
        if (moe->capacity > 0)
            printf(" capacity %g drop-policy %s router-shards %d", moe->capacity,
                   moe->drop_probs ? "probs" : "position", moe->shards > 1 ? moe->shards : 1);
    } else
        printf("ffn %d", o.cfg.ffn);
    printf(": %zu parameters\n", m->nparams);
    if (o.init != NULL)
        rc = ref_model_load(m, o.init);
    else
        ref_model_init_random(m, o.seed);
    if (rc == 0 && o.save_init != NULL)
        rc = ref_model_save(m, o.save_init);
    if (rc == 0 && o.steps > 0)
        rc = train(m, &o);
    if (rc == 0 && o.cfg.moe.capacity > 0 && o.cfg.moe.drop_probs) {
        long ties;
        double margin = ref_moe_drop_margin(&ties);
        printf("drop margin %.3g, exact ties %ld (a kept and a dropped choice's probabilities: "
               "their smallest relative gap, how often equal)\n", margin, ties);
    }
    if (rc == 0 && o.save != NULL)
        rc = ref_model_save(m, o.save);
    if (rc == 0 && o.have_generate)
        rc = generate(m, &o);
    ref_model_free(m);
    return rc == 0 ? 0 : 1;
}
