/*
** hfdir.c: the Hugging Face model directory of --save DIR (hfdir.h). The model's facts come
** from the generated program's resolved model (gpt_program.model_text: "key=value" lines);
** what Hugging Face needs and the model does not say is fixed here and documented in
** README.md ("Hugging Face checkpoints"): no dropout, no rope scaling, bos/eos from the
** --tokenizer's files (null without). Rank 0 alone calls the writers; weights.c orders the ranks around them.
*/
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hfdir.h"
#include "stage.h"        // defines: gpt (the program: model_text, model)

/* -- Paths ------------------------------------------------------------------------------------ */

static const char st_ext[] = ".safetensors";

int lib_hf_is_dir(const char *save)
{
    struct stat st;
    size_t n = strlen(save), m = strlen(st_ext);
    if (!stat(save, &st) && S_ISDIR(st.st_mode)) return 1;
    return n <= m || strcmp(save + n - m, st_ext);
}

void lib_hf_file_name(int k, int nfiles, char *out, size_t cap)
{
    if (nfiles == 1) snprintf(out, cap, "%s", ST_SINGLE_NAME);
    else snprintf(out, cap, "model-%05d-of-%05d.safetensors", k + 1, nfiles);
}

/* The files an export writes besides the safetensors files; a directory holding only these
** and model*.safetensors files is an earlier export, which --save DIR replaces. The tokenizer's
** companions are copied from beside its tokenizer.json when they are there. */
#define TOKENIZER_EXTRA "tokenizer_config.json", "special_tokens_map.json"
static const char *const hf_files[] = {
    "config.json", "generation_config.json", ST_INDEX_NAME, "tokenizer.json", TOKENIZER_EXTRA
};
static const char *const tokenizer_extra[] = { TOKENIZER_EXTRA };

static int export_file(const char *name)
{
    for (size_t k = 0; k < sizeof hf_files / sizeof *hf_files; k++)
        if (!strcmp(name, hf_files[k])) return 1;
    size_t n = strlen(name), m = strlen(st_ext);
    return !strncmp(name, "model", 5) && n > m && !strcmp(name + n - m, st_ext);
}

/*
** What 'dir' holds, for replacing it: 0 when it is absent or holds only regular files that
** 'ok' accepts; else -1 with the first other entry named in msg. 'remove': delete those files
** and the directory.
*/
static int only_files(const char *dir, int (*ok)(const char *), int remove, char *msg,
                      size_t cap)
{
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        snprintf(msg, cap, "cannot read the directory: %s", strerror(errno));
        return -1;
    }
    struct dirent *e;
    char path[ST_PATH_MAX + 512];
    int bad = 0;
    while (!bad && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        struct stat st;
        snprintf(path, sizeof path, "%.4000s/%s", dir, e->d_name);
        if (lstat(path, &st) || !S_ISREG(st.st_mode) || (ok && !ok(e->d_name))) {
            snprintf(msg, cap, "holds '%.100s', which an export does not write", e->d_name);
            bad = 1;
        } else if (remove && unlink(path)) {
            snprintf(msg, cap, "cannot remove '%.100s': %s", e->d_name, strerror(errno));
            bad = 1;
        }
    }
    closedir(d);
    if (!bad && remove && rmdir(dir)) {
        snprintf(msg, cap, "cannot remove the directory: %s", strerror(errno));
        bad = 1;
    }
    return bad ? -1 : 0;
}

/* The tokenizer.json of --tokenizer PATH (the file, or PATH/tokenizer.json) into out: 0, or
** -1 with msg set. */
static int tokenizer_json(const char *path, char *out, size_t cap, char *msg, size_t mcap)
{
    struct stat st;
    if (stat(path, &st)) {
        snprintf(msg, mcap, "cannot open: %s (--tokenizer)", strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) snprintf(out, cap, "%s/tokenizer.json", path);
    else snprintf(out, cap, "%s", path);
    FILE *f = fopen(out, "r");
    int c = ' ';
    while (f && (c = fgetc(f)) != EOF && (c == ' ' || c == '\n' || c == '\r' || c == '\t')) {}
    if (f) fclose(f);
    if (S_ISDIR(st.st_mode) && !f) {
        snprintf(msg, mcap, "holds no tokenizer.json (--tokenizer takes a Hugging Face "
                 "tokenizer.json or a directory holding one)");
        return -1;
    }
    if (!f || c != '{') {
        snprintf(msg, mcap, "%s (--tokenizer takes a Hugging Face tokenizer.json, a JSON "
                 "object, or a directory holding one)", f ? "is not a JSON object" :
                 strerror(errno));
        return -1;
    }
    return 0;
}

/* -- The tokenizer's special tokens -------------------------------------------------------- */

/*
** The ids of the tokenizer's bos and eos tokens: tokenizer_config.json beside tokenizer.json
** names them ("eos_token": "<|end_of_text|>", or {"content": ...}); tokenizer.json's
** "added_tokens" (or its model's "vocab") gives their ids. Read with jansson.
*/

/* The JSON of the file 'path', or NULL (missing, unreadable, not JSON). Read whole first:
** jansson reads a FILE a byte at a time, and Llama 3's tokenizer.json is 9 MB. */
static json_t *load_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    long n = -1;
    json_t *v = NULL;
    if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) &&
        (text = malloc((size_t)n + 1)) && fread(text, 1, (size_t)n, f) == (size_t)n) {
        json_error_t err;
        v = json_loadb(text, (size_t)n, 0, &err);
    }
    free(text);
    if (f) fclose(f);
    return v;
}

/* The content of tokenizer_config.json's 'key' (a string, or an object's "content") into
** out; "" when absent. */
static void special_token(json_t *conf, const char *key, char *out, size_t cap)
{
    json_t *v = json_object_get(conf, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    snprintf(out, cap, "%s", json_is_string(v) ? json_string_value(v) : "");
}

/* The id of the token whose text is 'content' in tokenizer.json: its added_tokens, then its
** model's vocab (an object); -1 when neither has it. */
static long long token_id(json_t *tok, const char *content)
{
    json_t *t, *id;
    size_t i;
    json_array_foreach(json_object_get(tok, "added_tokens"), i, t) {
        json_t *c = json_object_get(t, "content");
        id = json_object_get(t, "id");
        if (json_is_string(c) && json_is_integer(id) && !strcmp(json_string_value(c), content))
            return json_integer_value(id);
    }
    id = json_object_get(json_object_get(json_object_get(tok, "model"), "vocab"), content);
    return json_is_integer(id) ? json_integer_value(id) : -1;
}

/* The tokenizer's bos and eos: their texts (bos_text, eos_text: cap bytes each, "" when not
** named) and ids (-1 when unknown). */
typedef struct { char text[2][256]; long long id[2]; } hf_special;
static const char *const special_keys[2] = { "bos_token", "eos_token" };

static void special_ids(const char *tokenizer, hf_special *sp)
{
    char tj[ST_PATH_MAX], conf[ST_PATH_MAX + 32], msg[256];
    memset(sp, 0, sizeof *sp);
    sp->id[0] = sp->id[1] = -1;
    if (!tokenizer || tokenizer_json(tokenizer, tj, sizeof tj, msg, sizeof msg)) return;
    const char *slash = strrchr(tj, '/');
    snprintf(conf, sizeof conf, "%.*stokenizer_config.json", slash ? (int)(slash - tj + 1) : 0,
             tj);
    json_t *cj = load_json(conf), *tjs = cj ? load_json(tj) : NULL;
    for (int k = 0; k < 2 && tjs; k++) {
        special_token(cj, special_keys[k], sp->text[k], sizeof sp->text[k]);
        if (sp->text[k][0]) sp->id[k] = token_id(tjs, sp->text[k]);
    }
    json_decref(cj);
    json_decref(tjs);
}

/* -- The model's facts ------------------------------------------------------------------------ */

/* The value of "key=value" in the resolved model (gpt.prog->model_text) into buf; "" if none. */
static const char *fact(const char *key, char *buf, size_t cap)
{
    size_t n = strlen(key);
    buf[0] = 0;
    for (const char *p = gpt.prog->model_text; *p; ) {
        size_t len = strcspn(p, "\n");
        if (len > n && !strncmp(p, key, n) && p[n] == '=') {
            snprintf(buf, cap, "%.*s", (int)(len - n - 1), p + n + 1);
            break;
        }
        p += len + (p[len] == '\n');
    }
    return buf;
}

static int fact_is(const char *key, const char *value)
{
    char b[64];
    return !strcmp(fact(key, b, sizeof b), value);
}

/* A number of the model as JSON: integers as integers, other numbers as the shortest text
** that reads back as them, with a ".0" where Python's json would print a float. */
static const char *num_json(const char *key, int as_float, char *buf, size_t cap)
{
    char b[64], t[32];
    double x = strtod(fact(key, b, sizeof b), NULL);
    if (x == floor(x) && fabs(x) < 1e15) {
        snprintf(t, sizeof t, as_float ? "%.1f" : "%.0f", x);
    } else {
        for (int digits = 1; digits <= 17; digits++) {
            snprintf(t, sizeof t, "%.*g", digits, x);
            if (strtod(t, NULL) == x) break;
        }
    }
    /* copied: GCC's -fsanitize builds see a null destination in snprintf(buf, ...) here */
    size_t n = strlen(t) < cap ? strlen(t) : cap - 1;
    memcpy(buf, t, n);
    buf[n] = 0;
    return buf;
}

/* The Hugging Face architecture of the model, or NULL with the reason in why[cap]. */
typedef enum { HF_GPT2, HF_LLAMA, HF_MIXTRAL } hf_arch;

static int arch_of(hf_arch *a, char *why, size_t cap)
{
    /* a mixture of experts that Mixtral's router computes: softmax over the top-k logits
    ** (Megatron's pre_softmax = false), no scaling, groups, shared expert or expert bias */
    static const struct { const char *key, *value, *what; } mixtral[] = {
        { "moe.score_function", "softmax", "score_function = \"sigmoid\"" },
        { "moe.pre_softmax", "false", "pre_softmax = true" },
        { "moe.topk_scaling_factor", "none", "topk_scaling_factor" },
        { "moe.num_groups", "none", "group-limited routing (num_groups)" },
        { "moe.shared_expert_ffn", "none", "a shared expert" },
        { "moe.expert_bias", "false", "expert_bias = true" },
    };
    int moe = fact_is("moe", "yes");
    if (fact_is("arch", "gpt")) {
        if (moe) snprintf(why, cap, "a GPT model with a mixture of experts");
        else if (!fact_is("bias", "true")) snprintf(why, cap, "a GPT model without biases "
                                                   "(add_bias_linear = false)");
        else return *a = HF_GPT2, 1;
        return 0;
    }
    if (!moe) return *a = HF_LLAMA, 1;
    for (size_t k = 0; k < sizeof mixtral / sizeof *mixtral; k++)
        if (!fact_is(mixtral[k].key, mixtral[k].value)) {
            snprintf(why, cap, "a Llama mixture of experts with %s (Mixtral's router has "
                     "none)", mixtral[k].what);
            return 0;
        }
    return *a = HF_MIXTRAL, 1;
}

/* -- Start-up checks ---------------------------------------------------------------------- */

int lib_hf_check(const char *dir, const char *tokenizer, char *msg, size_t cap,
                 const char **where)
{
    hf_arch a;
    char why[256], tmp[ST_PATH_MAX], tj[ST_PATH_MAX];
    struct stat st;
    *where = dir;
    if (!arch_of(&a, why, sizeof why)) {
        *where = gpt.prog->model;
        snprintf(msg, cap, "--save DIR writes a Hugging Face model directory, and %s has no "
                 "Hugging Face architecture; write one file with --save FILE.safetensors", why);
        return 0;
    }
    if (!stat(dir, &st) && !S_ISDIR(st.st_mode)) {
        snprintf(msg, cap, "exists and is not a directory (--save DIR writes a Hugging Face "
                 "model directory; FILE.safetensors: one file)");
        return 0;
    }
    if (only_files(dir, export_file, 0, why, sizeof why)) {
        snprintf(msg, cap, "%s: --save DIR replaces a directory only when it holds a Hugging "
                 "Face export's files alone; remove it or name another directory", why);
        return 0;
    }
    snprintf(tmp, sizeof tmp, "%s%s", dir, HF_TMP_SUFFIX);
    if (only_files(tmp, NULL, 0, why, sizeof why)) {
        snprintf(msg, cap, "%s, the directory --save DIR writes first, %s and is not the "
                 "leftover of an interrupted export: remove it", tmp, why);
        return 0;
    }
    if (mkdir(tmp, 0755) && errno != EEXIST) {
        snprintf(msg, cap, "cannot write beside it (%s): %s", tmp, strerror(errno));
        return 0;
    }
    rmdir(tmp);
    if (tokenizer && tokenizer_json(tokenizer, tj, sizeof tj, msg, cap)) {
        *where = tokenizer;
        return 0;
    }
    hf_special sp;
    special_ids(tokenizer, &sp);
    long long vocab = strtoll(fact("vocab", why, sizeof why), NULL, 10);
    for (int k = 0; k < 2; k++)
        if (sp.id[k] >= vocab) {
            *where = tokenizer;
            snprintf(msg, cap, "its %s '%.100s' is id %lld, outside the model's vocabulary of "
                     "%lld: --tokenizer must be the model's own tokenizer", special_keys[k],
                     sp.text[k], sp.id[k], vocab);
            return 0;
        }
    return 1;
}

/* -- Writing ----------------------------------------------------------------------------------- */

/* The tensors from 'first' still waiting for a file (-1) get file 'k'. */
static void close_shard(int *file_of, int first, int end, int k)
{
    for (int j = first; j < end; j++)
        if (file_of[j] < 0) file_of[j] = k;
}

int lib_hf_shards(const long long *bytes, int n, long long limit, int *file_of)
{
    /* files are numbered in the order they are complete, as save_pretrained's list: a tensor
    ** above the limit at once, the file being filled when the next tensor would overflow it */
    int files = 0, first = -1;        /* the first tensor of the file being filled, -1: none */
    long long used = 0;
    for (int i = 0; i < n; i++) {
        if (bytes[i] > limit) {
            file_of[i] = files++;
            continue;
        }
        if (first >= 0 && used + bytes[i] > limit) {
            close_shard(file_of, first, i, files++);
            first = -1;
        }
        if (first < 0) first = i, used = 0;
        file_of[i] = -1;
        used += bytes[i];
    }
    if (first >= 0) close_shard(file_of, first, n, files++);
    return files ? files : 1;
}

void lib_hf_begin(const char *dir, char *tmp, size_t cap)
{
    char why[256];
    snprintf(tmp, cap, "%s%s", dir, HF_TMP_SUFFIX);
    RT_CHECK(only_files(tmp, NULL, 1, why, sizeof why) == 0, "%s: %s", tmp, why);
    RT_CHECK(mkdir(tmp, 0755) == 0, "%s: cannot create: %s", tmp, strerror(errno));
}

/* A file of the export: created in tmp, written by the caller, then closed by done(). */
static FILE *create(const char *tmp, const char *name, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", tmp, name);
    FILE *f = fopen(path, "w");
    RT_CHECK(f, "%s: cannot create: %s", path, strerror(errno));
    return f;
}

static void done(FILE *f, const char *path)
{
    RT_CHECK(!ferror(f) && fflush(f) == 0 && fsync(fileno(f)) == 0, "%s: write failed: %s",
             path, strerror(errno));
    RT_CHECK(fclose(f) == 0, "%s: write failed: %s", path, strerror(errno));
}

static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", (unsigned char)*s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

/* model.safetensors.index.json as save_pretrained writes it (keys sorted, indent 2). */
static void write_index(const char *tmp, const st_tensor *ts, const int *file_of, int n,
                        int nfiles)
{
    char path[ST_PATH_MAX], name[64];
    const st_tensor **sorted = malloc(sizeof *sorted * (size_t)n);
    RT_CHECK(sorted, "out of memory");
    long long total = 0;
    for (int i = 0; i < n; i++) {
        sorted[i] = &ts[i];
        total += ts[i].end - ts[i].begin;
    }
    qsort(sorted, (size_t)n, sizeof *sorted, by_name);
    FILE *f = create(tmp, ST_INDEX_NAME, path, sizeof path);
    fprintf(f, "{\n  \"metadata\": {\n    \"total_size\": %lld\n  },\n  \"weight_map\": {\n",
            total);
    for (int i = 0; i < n; i++) {
        lib_hf_file_name(file_of[sorted[i] - ts], nfiles, name, sizeof name);
        fprintf(f, "    ");
        put_string(f, sorted[i]->name);
        fprintf(f, ": \"%s\"%s\n", name, i + 1 < n ? "," : "");
    }
    fprintf(f, "  }\n}\n");
    done(f, path);
    free(sorted);
}

/* One "key": value of a JSON object, collected to be written sorted by key (as
** PretrainedConfig.to_json_string writes them). */
typedef struct { const char *key; char value[64]; } kv;
enum { KV_MAX = 40 };
typedef struct { int n; kv e[KV_MAX]; } kv_list;

static char *put(kv_list *l, const char *key)
{
    RT_CHECK(l->n < KV_MAX, "config.json: too many keys");
    l->e[l->n].key = key;
    return l->e[l->n++].value;
}

static void put_text(kv_list *l, const char *key, const char *text)   /* JSON as is */
{
    snprintf(put(l, key), sizeof l->e[0].value, "%s", text);
}

static void put_fact(kv_list *l, const char *key, const char *model_key, int as_float)
{
    num_json(model_key, as_float, put(l, key), sizeof l->e[0].value);
}

static int by_key(const void *a, const void *b)
{
    return strcmp(((const kv *)a)->key, ((const kv *)b)->key);
}

static void write_object(const char *tmp, const char *name, kv_list *l)
{
    char path[ST_PATH_MAX];
    qsort(l->e, (size_t)l->n, sizeof *l->e, by_key);
    FILE *f = create(tmp, name, path, sizeof path);
    fprintf(f, "{\n");
    for (int i = 0; i < l->n; i++)
        fprintf(f, "  \"%s\": %s%s\n", l->e[i].key, l->e[i].value, i + 1 < l->n ? "," : "");
    fprintf(f, "}\n");
    done(f, path);
}

/*
** config.json: every fact of the model under its Hugging Face name; what the model does not
** say is decided here: dropout 0 (we train without), no rope scaling, and bos/eos the ids of
** --tokenizer's bos_token and eos_token (special_ids), null when not known (without null,
** GPT2Config would claim 50256, LlamaConfig 1 and 2).
*/
static void write_config(const char *tmp, hf_arch a, st_dtype dtype, const hf_special *sp)
{
    kv_list l = { 0 }, g = { 0 };
    char b[64];
    const char *dt = dtype == ST_BF16 ? "\"bfloat16\"" : "\"float32\"";
    const char *id_keys[2] = { "bos_token_id", "eos_token_id" };
    put_text(&l, "torch_dtype", dt);
    for (int k = 0; k < 2; k++) {
        if (sp->id[k] < 0) {
            put_text(&l, id_keys[k], "null");
            continue;
        }
        snprintf(put(&l, id_keys[k]), sizeof l.e[0].value, "%lld", sp->id[k]);
        snprintf(put(&g, id_keys[k]), sizeof g.e[0].value, "%lld", sp->id[k]);
    }
    put_fact(&l, "vocab_size", "vocab", 0);
    put_fact(&l, "initializer_range", "init_std", 1);
    put_text(&l, "tie_word_embeddings", fact("tie_embeddings", b, sizeof b));
    put_text(&l, "use_cache", "true");
    if (a == HF_GPT2) {
        put_text(&l, "architectures", "[\"GPT2LMHeadModel\"]");
        put_text(&l, "model_type", "\"gpt2\"");
        put_text(&l, "activation_function", "\"gelu_new\"");   /* GELU, tanh approximation */
        put_fact(&l, "n_layer", "layers", 0);
        put_fact(&l, "n_embd", "hidden", 0);
        put_fact(&l, "n_head", "heads", 0);
        put_fact(&l, "n_inner", "ffn_hidden", 0);
        put_fact(&l, "n_positions", "seq_len", 0);
        put_fact(&l, "n_ctx", "seq_len", 0);
        put_fact(&l, "layer_norm_epsilon", "norm_eps", 1);
        put_text(&l, "attn_pdrop", "0.0");
        put_text(&l, "embd_pdrop", "0.0");
        put_text(&l, "resid_pdrop", "0.0");
        put_text(&l, "scale_attn_weights", "true");
        put_text(&l, "scale_attn_by_inverse_layer_idx", "false");
        put_text(&l, "reorder_and_upcast_attn", "false");
    } else {
        int moe = a == HF_MIXTRAL;
        put_text(&l, "architectures", moe ? "[\"MixtralForCausalLM\"]" : "[\"LlamaForCausalLM\"]");
        put_text(&l, "model_type", moe ? "\"mixtral\"" : "\"llama\"");
        put_text(&l, "hidden_act", "\"silu\"");
        put_fact(&l, "num_hidden_layers", "layers", 0);
        put_fact(&l, "hidden_size", "hidden", 0);
        put_fact(&l, "num_attention_heads", "heads", 0);
        put_fact(&l, "num_key_value_heads", "kv_heads", 0);
        put_fact(&l, "head_dim", "head_dim", 0);
        put_fact(&l, "intermediate_size", moe ? "moe.ffn_hidden" : "ffn_hidden", 0);
        put_fact(&l, "max_position_embeddings", "seq_len", 0);
        put_fact(&l, "rms_norm_eps", "norm_eps", 1);
        put_fact(&l, "rope_theta", "rope_theta", 1);
        put_text(&l, "attention_dropout", "0.0");
        if (moe) {
            put_fact(&l, "num_local_experts", "moe.experts", 0);
            put_fact(&l, "num_experts_per_tok", "moe.top_k", 0);
            put_fact(&l, "router_aux_loss_coef", "moe.aux_loss_coeff", 1);
            put_text(&l, "router_jitter_noise", "0.0");
            put_text(&l, "output_router_logits", "false");
            put_text(&l, "sliding_window", "null");
        } else {
            put_text(&l, "attention_bias", "false");
            put_text(&l, "mlp_bias", "false");
            put_text(&l, "pretraining_tp", "1");
            put_text(&l, "rope_scaling", "null");
        }
    }
    write_object(tmp, "config.json", &l);
    /* generate()'s defaults: the whole context (transformers' own default is 20 tokens), and
    ** the tokenizer's bos and eos where known */
    put_fact(&g, "max_length", "seq_len", 0);
    write_object(tmp, "generation_config.json", &g);
}

/* Copy 'from' into tmp/name (whole, synced). */
static void copy_file(const char *from, const char *tmp, const char *name)
{
    char path[ST_PATH_MAX], buf[1 << 16];
    FILE *in = fopen(from, "rb");
    RT_CHECK(in, "%s: cannot open: %s (--tokenizer)", from, strerror(errno));
    FILE *out = create(tmp, name, path, sizeof path);
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        RT_CHECK(fwrite(buf, 1, n, out) == n, "%s: write failed: %s", path, strerror(errno));
    RT_CHECK(!ferror(in), "%s: read failed: %s", from, strerror(errno));
    fclose(in);
    done(out, path);
}

/* tokenizer.json, and tokenizer_config.json and special_tokens_map.json where they are beside
** it. */
static void copy_tokenizer(const char *tokenizer, const char *tmp)
{
    char tj[ST_PATH_MAX], msg[256], other[ST_PATH_MAX + 64];
    RT_CHECK(tokenizer_json(tokenizer, tj, sizeof tj, msg, sizeof msg) == 0, "%s: %s",
             tokenizer, msg);
    copy_file(tj, tmp, "tokenizer.json");
    const char *slash = strrchr(tj, '/');
    int dirlen = slash ? (int)(slash - tj + 1) : 0;
    for (size_t k = 0; k < sizeof tokenizer_extra / sizeof *tokenizer_extra; k++) {
        struct stat st;
        snprintf(other, sizeof other, "%.*s%s", dirlen, tj, tokenizer_extra[k]);
        if (!stat(other, &st) && S_ISREG(st.st_mode)) copy_file(other, tmp, tokenizer_extra[k]);
    }
}

static void sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    RT_CHECK(fd >= 0 && fsync(fd) == 0, "%s: fsync failed: %s", dir, strerror(errno));
    close(fd);
}

/* The directory that holds 'path' ("." if none), synced: a rename there is durable. */
static void sync_parent(const char *path)
{
    char d[ST_PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(d, sizeof d, ".");
    else snprintf(d, sizeof d, "%.*s", (int)(slash == path ? 1 : slash - path), path);
    sync_dir(d);
}

void lib_hf_finish(const char *dir, const char *tmp, const st_tensor *ts, const int *file_of,
                   int n, int nfiles, st_dtype dtype, const char *tokenizer)
{
    hf_arch a;
    char why[256];
    RT_CHECK(arch_of(&a, why, sizeof why), "--save %s: %s", dir, why);
    if (nfiles > 1) write_index(tmp, ts, file_of, n, nfiles);
    hf_special sp;
    special_ids(tokenizer, &sp);
    write_config(tmp, a, dtype, &sp);
    if (tokenizer) copy_tokenizer(tokenizer, tmp);
    sync_dir(tmp);
    /* an earlier DIR (checked at start-up: an export's files alone) is swapped out in one
    ** step where the system can (renameat2's exchange), then removed */
    struct stat st;
    if (stat(dir, &st)) {
        RT_CHECK(rename(tmp, dir) == 0, "cannot rename %s to %s: %s", tmp, dir, strerror(errno));
    } else if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
        RT_CHECK(only_files(tmp, export_file, 1, why, sizeof why) == 0,
                 "%s (the earlier %s): %s", tmp, dir, why);
    } else {
        char old[ST_PATH_MAX + 8];
        snprintf(old, sizeof old, "%s.old", dir);
        RT_CHECK(only_files(old, export_file, 1, why, sizeof why) == 0, "%s: %s", old, why);
        RT_CHECK(rename(dir, old) == 0 && rename(tmp, dir) == 0, "cannot rename %s to %s: %s",
                 tmp, dir, strerror(errno));
        RT_CHECK(only_files(old, export_file, 1, why, sizeof why) == 0, "%s: %s", old, why);
    }
    sync_parent(dir);
}
