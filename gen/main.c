/*
** main.c: the command line of build/gen (lua.c's shape). Parses the arguments from the option
** table below into the Lua table `opts`, runs require("driver").run(opts) in a protected
** call, reports errors and picks the exit code: 0 ok, 1 user error, 2 usage error,
** 3 internal error (a generator bug: traceback printed). Knows nothing about transformers.
** Developer modes: --lua FILE [args] runs a Lua script in the same prepared state;
** --driver FILE [options] MODEL runs FILE in place of gen/lua/driver.lua (CLI tests).
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "diag.h"   // defines: diag_report, diag_error, diag_source, diag_text
#include "host.h"   // defines: host_newstate, host_open, host_close, host_set_mem_limit

/* -- Options ------------------------------------------------------------------------------ */

/* Options of `gen`, in --help order: long name, kind, metavariable, help (DESIGN.md 4.1).
** The key in `opts` is the name with '-' replaced by '_'. */
#define GEN_OPTIONS(_) \
    _("tp",           INT,  "N",    "tensor-parallel size (default 1)") \
    _("pp",           INT,  "N",    "pipeline-parallel size (default 1)") \
    _("dp",           INT,  "N",    "data-parallel size (default 1)") \
    _("cp",           INT,  "N",    "context-parallel size (default 1)") \
    _("ep",           INT,  "N",    "expert-parallel size (default 1)") \
    _("etp",          INT,  "N",    "expert tensor-parallel size (default: tp)") \
    _("vp",           INT,  "N",    "virtual pipeline chunks per stage (default 1)") \
    _("order",        STR,  "S",    "rank order (default tp-cp-ep-dp-pp)") \
    _("first-layers", INT,  "N",    "layers on the first pipeline stage (uneven)") \
    _("last-layers",  INT,  "N",    "layers on the last pipeline stage (uneven)") \
    _("account-embedding", FLAG, "", "even split: count the embedding as a layer") \
    _("account-loss", FLAG, "",     "even split: count the loss as a layer") \
    _("layout",       STR,  "S",    "layers per virtual stage: \"E|t*4|t*4|L\" (Megatron's)") \
    _("microbatch-group", INT, "N", "interleaved: micro-batches per group (default pp)") \
    _("mbs",          INT,  "N",    "micro-batch size") \
    _("nmb",          INT,  "N",    "micro-batches per step") \
    _("gbs",          INT,  "N",    "global batch (sequences): NMB = GBS/(MBS*DP)") \
    _("seq",          INT,  "N",    "sequence length") \
    _("cp-comm",      STR,  "C",    "context-parallel attention: p2p (ring, default) or a2a") \
    _("sp",           FLAG, "",     "sequence parallelism") \
    _("dist-opt",     FLAG, "",     "distributed optimizer") \
    _("bf16",         FLAG, "",     "bf16 mixed precision (f32 main weights, gradients)") \
    _("no-overlap",   FLAG, "",     "overlap no communication (the same numbers)") \
    _("bucket-size",  INT,  "N",    "gradient bucket elements (default max(40M, 1M*DP*CP))") \
    _("recompute",    STR,  "G",    "activation recompute: selective or full") \
    _("recompute-method", STR, "M", "full: uniform or block") \
    _("recompute-layers", INT, "N", "full: layers per group (uniform) or chunk (block)") \
    _("recompute-modules", STR, "L", "selective: core_attn (default), layernorm, mlp") \
    _("out",          STR,  "DIR",  "output directory (default out/<model>-tp<T>-...)") \
    _("print-out",    FLAG, "",     "print the output directory and exit") \
    _("inspect",      FLAG, "",     "print the report to stdout; write nothing") \
    _("rank",         INT,  "R",    "with --inspect: only rank R") \
    _("dump",         STR,  "PASS", "print a pass's result (config|topology|...)") \
    _("check",        FLAG, "",     "validate only; write nothing") \
    _("topology-only", FLAG, "",    "write only the build-time picture, no program") \
    _("line-dirs",    FLAG, "",     "emit #line directives into generated sources") \
    _("sbatch",       FLAG, "",     "print a Slurm batch script (write nothing)") \
    _("nodes",        INT,  "N",    "--sbatch: nodes (N x tasks-per-node = the world)") \
    _("tasks-per-node", INT, "N",   "--sbatch: ranks per node (a GPU each with cuda)") \
    _("backend",      STR,  "B",    "--sbatch: cuda (train_cuda, default) or cpu (train)") \
    _("time",         STR,  "T",    "--sbatch: time limit, [D-]HH:MM:SS (default 24:00:00)") \
    _("partition",    STR,  "P",    "--sbatch: Slurm partition (default: the cluster's)") \
    _("account",      STR,  "A",    "--sbatch: Slurm account (default: the user's)") \
    _("ckpt-dir",     STR,  "DIR",  "--sbatch: checkpoints (default ckpt/<out dir name>)") \
    _("warn",         INT,  "S",    "--sbatch: seconds of warning before the limit (120)") \
    _("train-args",   STR,  "ARGS", "--sbatch: the training flags (--data F --steps N ...)") \
    _("plan",         FLAG, "",     "print the layouts of --gpus ranks that fit, fastest") \
    _("gpus",         INT,  "N",    "--plan: ranks (GPUs) to lay the model out on") \
    _("gpus-per-node", INT, "N",    "--plan: ranks per node (default 8; cpu: all)") \
    _("gpu",          STR,  "G",    "--plan and warnings: h100 (default), h200, a100 or cpu") \
    _("gpu-mem",      STR,  "GIB",  "memory of one device in GiB (--plan; warn above it)") \
    _("cpu-rates",    STR,  "F,B,L", "--plan GPU=cpu: core GFLOP/s,GB/s[,all-reduce GB/s]") \
    _("cores",        INT,  "N",    "--plan GPU=cpu: the machine's cores") \
    _("top",          INT,  "N",    "--plan: layouts in the table (default 10)") \
    _("verbose",      FLAG, "",     "--plan: also every rejected layout and why")

typedef enum { OPT_INT, OPT_STR, OPT_FLAG } opt_kind;

typedef struct opt_def {
    const char *name;
    opt_kind kind;
    const char *metavar;
    const char *help;
} opt_def;

static const opt_def gen_options[] = {
#define GEN_OPT_DEF(name, kind, meta, help) {name, OPT_##kind, meta, help},
    GEN_OPTIONS(GEN_OPT_DEF)
#undef GEN_OPT_DEF
};

#define GEN_NOPTS (sizeof gen_options / sizeof gen_options[0])

typedef enum { MODE_DRIVER, MODE_LUA } gen_mode;

typedef struct gen_args {
    gen_mode mode;
    const char *script;                 /* --lua FILE / --driver FILE, else NULL */
    const char *model;                  /* positional MODEL */
    const char *value[GEN_NOPTS];       /* option values as given; flags "" when set */
    long long ival[GEN_NOPTS];          /* parsed OPT_INT values */
    int argc;                           /* MODE_LUA: script arguments argv[first..argc) */
    char **argv;
    int first;
} gen_args;

/*
** Print the usage text to 'f' (aligned in two columns; fits 80 columns).
*/
static void print_usage(FILE *f)
{
    fputs("usage: gen [options] MODEL       MODEL = models/<name>.lua or <name>\n"
          "Generates the distributed (Megatron-style) training programs of MODEL.\n"
          "\n"
          "options:\n", f);
    for (size_t i = 0; i < GEN_NOPTS; i++) {
        const opt_def *o = &gen_options[i];
        char left[40];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->metavar[0] ? " " : "", o->metavar);
        fprintf(f, "  %-22s  %s\n", left, o->help);
    }
    fprintf(f, "  %-22s  %s\n", "-h, --help", "print this help and exit");
    fputs("\nValues: --tp 8 or --tp=8. Exit status: 0 ok, 1 error in the input, 2 usage\n"
          "error, 3 internal error (a generator bug; please report it).\n", f);
}

/* Report "gen: usage error: ..." and the hint; returns 2 (the exit code). */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    diag_report("usage error", NULL, 0, "%s", msg);
    diag_text("try '" DIAG_PROGNAME " --help'");
    return 2;
}

/*
** Parse a non-negative decimal integer (digits only, no sign) into *out; 0 when fine.
*/
static int parse_count(const char *s, long long *out)
{
    long long v = 0;
    if (*s == '\0') return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        if (v > (0x7fffffffffffffffLL - (*s - '0')) / 10) return -1;
        v = v * 10 + (*s - '0');
    }
    *out = v;
    return 0;
}

/*
** Parse argv into 'a'. Returns 0 to run, 1 after printing the help (exit 0), or 2 after
** reporting a usage error.
*/
static int parse_args(int argc, char **argv, gen_args *a)
{
    memset(a, 0, sizeof *a);
    int i = 1;
    if (argc >= 2 && (strcmp(argv[1], "--lua") == 0 || strcmp(argv[1], "--driver") == 0)) {
        if (argc < 3) return usage_error("option '%s' needs a Lua file", argv[1]);
        a->mode = strcmp(argv[1], "--lua") == 0 ? MODE_LUA : MODE_DRIVER;
        a->script = argv[2];
        if (a->mode == MODE_LUA) {
            a->argc = argc;
            a->argv = argv;
            a->first = 2;
            return 0;
        }
        i = 3;
    }
    int only_positional = 0;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (!only_positional && strcmp(arg, "--") == 0) {
            only_positional = 1;
            continue;
        }
        if (only_positional || arg[0] != '-' || arg[1] == '\0') {
            if (a->model != NULL)
                return usage_error("unexpected argument '%s' (MODEL is already '%s')", arg,
                                   a->model);
            a->model = arg;
            continue;
        }
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            print_usage(stdout);
            return 1;
        }
        if (arg[1] != '-') return usage_error("unknown option '%s'", arg);
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t n = eq ? (size_t)(eq - name) : strlen(name);
        size_t k = 0;
        while (k < GEN_NOPTS && !(strlen(gen_options[k].name) == n
                                  && strncmp(gen_options[k].name, name, n) == 0))
            k++;
        if (k == GEN_NOPTS) {
            return usage_error("unknown option '--%.*s'", (int)(n > 100 ? 100 : n), name);
        }
        const opt_def *o = &gen_options[k];
        const char *value;
        if (o->kind == OPT_FLAG) {
            if (eq) return usage_error("option '--%s' takes no value", o->name);
            value = "";
        } else if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            return usage_error("option '--%s' needs a value (%s)", o->name, o->metavar);
        }
        if (o->kind == OPT_INT && parse_count(value, &a->ival[k]) != 0)
            return usage_error("option '--%s' needs a non-negative decimal integer, got '%s'",
                               o->name, value);
        a->value[k] = value;   /* given twice: the last one counts */
    }
    return 0;
}

/* Push the table `opts` for driver.run: absent options are nil. */
static void push_opts(lua_State *L, const gen_args *a)
{
    lua_createtable(L, 0, 8);
    if (a->model) {
        lua_pushstring(L, a->model);
        lua_setfield(L, -2, "model");
    }
    for (size_t k = 0; k < GEN_NOPTS; k++) {
        if (a->value[k] == NULL) continue;
        switch (gen_options[k].kind) {
        case OPT_INT:  lua_pushinteger(L, (lua_Integer)a->ival[k]); break;
        case OPT_STR:  lua_pushstring(L, a->value[k]); break;
        case OPT_FLAG: lua_pushboolean(L, 1); break;
        }
        luaL_gsub(L, gen_options[k].name, "-", "_");
        lua_insert(L, -2);
        lua_settable(L, -3);
    }
}

/* -- Errors ------------------------------------------------------------------------------- */

/* Whether the value at 'idx' is a located error {file=, line=, msg=[, col=, source=]}. */
static int is_located(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx)) return 0;
    int ok = lua_getfield(L, idx, "msg") == LUA_TSTRING;
    int t = lua_getfield(L, idx, "file");
    ok = ok && (t == LUA_TNIL || t == LUA_TSTRING);
    t = lua_getfield(L, idx, "line");
    int isnum;
    lua_tointegerx(L, -1, &isnum);
    ok = ok && (t == LUA_TNIL || (t == LUA_TNUMBER && isnum));
    lua_pop(L, 3);
    return ok;
}

/*
** Whether the error object at 'idx' is a user error: a located error, or {errors = {...}}
** holding one or more located errors. Anything else is a generator bug.
*/
static int is_user_error(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    if (is_located(L, idx)) return 1;
    if (!lua_istable(L, idx) || lua_getfield(L, idx, "errors") != LUA_TTABLE) {
        if (lua_istable(L, idx)) lua_pop(L, 1);
        return 0;
    }
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
    int ok = n > 0;
    for (lua_Integer i = 1; ok && i <= n; i++) {
        lua_rawgeti(L, -1, i);
        ok = is_located(L, -1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return ok;
}

/* Print one located error (checked by is_located) as "file:line: error: msg". */
static void print_located(lua_State *L, int idx)
{
    lua_getfield(L, idx, "msg");
    lua_getfield(L, idx, "file");
    lua_getfield(L, idx, "line");
    lua_getfield(L, idx, "col");
    lua_getfield(L, idx, "source");
    const char *file = lua_tostring(L, -4);
    long line = lua_type(L, -3) == LUA_TNUMBER ? (long)lua_tointeger(L, -3) : 0;
    diag_error(file, line, "%s", lua_tostring(L, -5));
    if (file != NULL && lua_type(L, -1) == LUA_TSTRING) {
        size_t n;
        const char *src = lua_tolstring(L, -1, &n);
        diag_source(src, n, lua_type(L, -2) == LUA_TNUMBER ? (long)lua_tointeger(L, -2) : 0);
    }
    lua_pop(L, 5);
}

/*
** Message handler (lua.c): user errors pass through untouched; anything else becomes
** "message + traceback" for the internal-error report.
*/
static int msghandler(lua_State *L)
{
    if (is_user_error(L, 1)) return 1;
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
            msg = lua_tostring(L, -1);
        else if (lua_istable(L, 1))
            msg = "(error object is a table that is not a user error {file=, line=, msg=})";
        else
            msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/*
** Report the outcome 'status' of a protected call whose error object is on top; returns the
** exit code (0 ok, 1 user error, 3 internal error).
*/
static int report(lua_State *L, int status)
{
    if (status == LUA_OK) return 0;
    host_set_mem_limit(L, 0);   /* a capped state could not even format the message */
    if (status != LUA_ERRMEM && is_user_error(L, -1)) {
        int top = lua_gettop(L);
        if (lua_getfield(L, top, "errors") == LUA_TTABLE) {
            lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
            for (lua_Integer i = 1; i <= n; i++) {
                lua_rawgeti(L, -1, i);
                print_located(L, lua_gettop(L));
                lua_pop(L, 1);
            }
        } else {
            print_located(L, top);
        }
        lua_settop(L, top);
        diag_report("error", NULL, 0, "no output written");
        return 1;
    }
    const char *msg = lua_tostring(L, -1);
    diag_report("internal error", NULL, 0, "%s",
                msg ? msg : "(error object is not a string)");
    return 3;
}

/* -- Running ------------------------------------------------------------------------------ */

/* Protected body of --lua: global `arg` = {[0] = FILE, ...}; FILE runs with ... = args. */
static int run_script(lua_State *L)
{
    const gen_args *a = lua_touserdata(L, 1);
    int nargs = a->argc - a->first - 1;
    lua_createtable(L, nargs, 1);
    for (int i = a->first; i < a->argc; i++) {
        lua_pushstring(L, a->argv[i]);
        lua_rawseti(L, -2, i - a->first);
    }
    lua_setglobal(L, "arg");
    if (luaL_loadfile(L, a->script) != LUA_OK) return lua_error(L);
    luaL_checkstack(L, nargs, "too many arguments to the script");
    for (int i = a->first + 1; i < a->argc; i++) lua_pushstring(L, a->argv[i]);
    lua_call(L, nargs, 0);
    return 0;
}

/* Protected body of a normal run: require("driver").run(opts). */
static int run_driver(lua_State *L)
{
    const gen_args *a = lua_touserdata(L, 1);
    if (a->script != NULL) {   /* --driver FILE: FILE returns the driver module */
        if (luaL_loadfile(L, a->script) != LUA_OK) return lua_error(L);
        lua_call(L, 0, 1);
    } else {
        lua_getglobal(L, "require");
        lua_pushliteral(L, "driver");
        lua_call(L, 1, 1);
    }
    if (!lua_istable(L, -1)) return luaL_error(L, "the driver module is not a table");
    if (lua_getfield(L, -1, "run") != LUA_TFUNCTION)
        return luaL_error(L, "the driver module has no function 'run'");
    push_opts(L, a);
    lua_call(L, 1, 0);
    return 0;
}

/*
** Everything that needs Lua, under lua_pcall (lua.c's pmain): prepare the state, run the
** driver or the script under the message handler, report. Returns the exit code.
*/
static int pmain(lua_State *L)
{
    const gen_args *a = lua_touserdata(L, 1);
    host_open(L);
    lua_pushcfunction(L, msghandler);
    int base = lua_gettop(L);
    lua_pushcfunction(L, a->mode == MODE_LUA ? run_script : run_driver);
    lua_pushlightuserdata(L, (void *)a);
    int status = lua_pcall(L, 1, 0, base);
    lua_pushinteger(L, report(L, status));
    return 1;
}

/* Exit code 'code', or 1 when standard output could not be written (a full disk, ...). */
static int flush_stdout(int code)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        diag_report("error", NULL, 0, "cannot write to standard output");
        if (code == 0) code = 1;
    }
    return code;
}

int main(int argc, char **argv)
{
    gen_args args;
    int rc = parse_args(argc, argv, &args);
    if (rc == 1) return flush_stdout(EXIT_SUCCESS);
    if (rc != 0) return 2;
    lua_State *L = host_newstate();
    if (L == NULL) return 3;
    lua_pushcfunction(L, pmain);
    lua_pushlightuserdata(L, &args);
    int status = lua_pcall(L, 1, 1, 0);   /* fails only if the host itself does */
    int code = status == LUA_OK ? (int)lua_tointeger(L, -1) : report(L, status);
    host_close(L);
    return flush_stdout(code);
}
