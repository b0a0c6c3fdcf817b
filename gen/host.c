/*
** host.c: creates and prepares the generator's lua_State, and implements the Lua module
** `host` (the little the Lua passes need from the OS: directories, renames, a clock, memory).
** It is not a general OS binding: files are read and written with Lua's io library.
** Called by main.c (host_newstate, host_open, host_close) and tmpl.c (host_root).
*/
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lualib.h>

#include "buf.h"    // defines: buf, buf_add, buf_read_file
#include "diag.h"   // defines: xmalloc, diag_report
#include "host.h"   // defines: host_newstate, host_open, host_close, host_root, luaopen_host
#include "tmpl.h"   // defines: luaopen_tmpl

#define HOST_ROOT_KEY "gen.root"   /* registry: the repository root (absolute, no trailing /) */

/* -- Allocator --------------------------------------------------------------------------- */

#define HOST_CLOCK_EVERY ((size_t)16 << 20)  /* bytes grown between reads of the CPU clock */

typedef struct host_mem {
    size_t used;        /* bytes currently allocated by the state */
    size_t limit;       /* cap on 'used' for growing allocations; 0 = none */
    double deadline;    /* CPU time (seconds, as clock()) after which growth fails; 0 = none */
    size_t grown;       /* bytes grown since the clock was last read */
    int late;           /* the deadline has passed: every growth fails until it is cleared */
} host_mem;

/*
** Whether the CPU-time deadline of 'm' has passed; reads the clock at most once per
** HOST_CLOCK_EVERY bytes grown, so that work done in C (string.rep, concatenation, which
** the Lua hook cannot interrupt) is bounded by the deadline too.
*/
static int host_late(host_mem *m, size_t growth)
{
    if (m->deadline == 0 || m->late) return m->late;
    m->grown += growth;
    if (m->grown < HOST_CLOCK_EVERY) return 0;
    m->grown = 0;
    m->late = (double)clock() / CLOCKS_PER_SEC > m->deadline;
    return m->late;
}

/*
** lua_Alloc with accounting. An allocation or growth that would take 'used' above 'limit',
** or that comes after the deadline, fails (Lua then collects garbage, retries, and raises
** "not enough memory"); frees and shrinks always succeed, so Lua can always give memory back.
*/
static void *host_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    host_mem *m = ud;
    size_t old = ptr ? osize : 0;   /* for a new block, osize encodes the object type */
    if (nsize == 0) {
        free(ptr);
        m->used -= old;
        return NULL;
    }
    if (nsize > old && host_late(m, nsize - old)) return NULL;
    if (m->limit != 0 && nsize > old && m->used - old + nsize > m->limit) return NULL;
    void *p = realloc(ptr, nsize);
    if (p == NULL) return NULL;
    m->used = m->used - old + nsize;
    return p;
}

static int host_panic(lua_State *L)
{
    const char *msg = lua_tostring(L, -1);
    diag_report("internal error", NULL, 0, "unprotected Lua error: %s",
                msg ? msg : "(error object is not a string)");
    return 0;   /* Lua aborts */
}

static host_mem *host_getmem(lua_State *L)
{
    void *ud;
    lua_getallocf(L, &ud);
    return ud;
}

/*
** Create a bare lua_State with the accounting allocator (no libraries yet: host_open adds
** them under protection). Returns NULL, after reporting, when memory is exhausted.
*/
lua_State *host_newstate(void)
{
    host_mem *m = xmalloc(sizeof *m);
    m->used = 0;
    m->limit = 0;
    m->deadline = 0;
    m->grown = 0;
    m->late = 0;
    lua_State *L = lua_newstate(host_alloc, m);
    if (L == NULL) {
        free(m);
        diag_report("error", NULL, 0, "cannot create the Lua state: not enough memory");
        return NULL;
    }
    lua_atpanic(L, host_panic);
    return L;
}

/*
** Close a state made by host_newstate and free its allocator record.
*/
void host_close(lua_State *L)
{
    host_mem *m = host_getmem(L);
    lua_close(L);
    free(m);
}

/*
** Set the allocation cap of L to 'limit' bytes (0 removes it); returns the previous cap.
*/
size_t host_set_mem_limit(lua_State *L, size_t limit)
{
    host_mem *m = host_getmem(L);
    size_t old = m->limit;
    m->limit = limit;
    return old;
}

/* -- Repository root --------------------------------------------------------------------- */

/*
** The repository root as an absolute path: the parent of the directory holding the running
** executable (/proc/self/exe = <root>/build/gen). Pushes it, or raises an error.
*/
static void host_push_root(lua_State *L)
{
    size_t cap = 256;
    char *exe = NULL;
    ssize_t n;
    for (;;) {
        exe = xrealloc(exe, cap);
        n = readlink("/proc/self/exe", exe, cap);
        if (n < 0 || (size_t)n < cap) break;
        cap *= 2;
    }
    if (n <= 0) {
        free(exe);
        luaL_error(L, "cannot locate the generator executable (/proc/self/exe: %s)",
                   strerror(errno));
    }
    exe[n] = '\0';
    for (int up = 0; up < 2; up++) {   /* <root>/build/gen -> <root>/build -> <root> */
        char *slash = strrchr(exe, '/');
        if (slash == NULL || slash == exe) {
            free(exe);
            luaL_error(L, "the generator executable is not in <root>/build/");
        }
        *slash = '\0';
    }
    lua_pushstring(L, exe);
    free(exe);
}

/*
** The repository root recorded by host_open (absolute; for opening files, never for
** printing). The string stays valid as long as L.
*/
const char *host_root(lua_State *L)
{
    lua_getfield(L, LUA_REGISTRYINDEX, HOST_ROOT_KEY);
    const char *root = lua_tostring(L, -1);
    lua_pop(L, 1);   /* the registry keeps the string alive */
    return root ? root : ".";
}

/* -- Module search ----------------------------------------------------------------------- */

/*
** 'path' without the "<root>/" prefix when it has one: what chunk names and messages show.
*/
static const char *host_relative(lua_State *L, const char *path)
{
    const char *root = host_root(L);
    size_t n = strlen(root);
    if (strncmp(path, root, n) == 0 && path[n] == '/') return path + n + 1;
    return path;
}

/*
** The precompiled form of <root>/gen/lua/X.lua, <root>/build/obj/gen/lua/X.luac (luac5.4 at
** build time, gen/gen.mk: it keeps the chunk name "@gen/lua/X.lua" and the line information),
** loaded in its place when it is at least as new as the source: compiling the passes' 12k
** lines was most of a small layout's time (build/gen tiny: 29-34 ms of CPU from the sources,
** 20 from these). 1 when the chunk is on the stack; 0 (nothing
** pushed) when there is none, it is older than the source, or it does not load (another Lua's
** bytecode): then the caller reads the source.
*/
static int host_load_compiled(lua_State *L, const char *file, const char *rel)
{
    if (strncmp(rel, "gen/lua/", 8) != 0) return 0;
    struct stat src, bin;
    const char *path = lua_pushfstring(L, "%s/build/obj/%sc", host_root(L), rel);
    int fresh = stat(file, &src) == 0 && stat(path, &bin) == 0 &&
                (bin.st_mtim.tv_sec > src.st_mtim.tv_sec ||
                 (bin.st_mtim.tv_sec == src.st_mtim.tv_sec &&
                  bin.st_mtim.tv_nsec >= src.st_mtim.tv_nsec));
    buf code = BUF_INIT;
    if (!fresh || buf_read_file(&code, path) != 0) {
        buf_free(&code);
        lua_pop(L, 1);
        return 0;
    }
    lua_pop(L, 1);
    lua_pushfstring(L, "@%s", rel);
    int st = luaL_loadbufferx(L, buf_cstr(&code), code.len, lua_tostring(L, -1), "b");
    buf_free(&code);
    lua_remove(L, -2);              /* the chunk name */
    if (st != LUA_OK) {
        lua_pop(L, 1);              /* its error: the source is read instead */
        return 0;
    }
    return 1;
}

/*
** package.searchers[2]: finds module 'name' along package.path (normally <root>/gen/lua/?.lua)
** like Lua's own searcher, but names the chunk "@gen/lua/name.lua" (root-relative), so that
** error positions and tracebacks never carry absolute paths; a module's precompiled form when
** it is current (host_load_compiled). Upvalue 1: the package table.
*/
static int host_searcher(lua_State *L)
{
    const char *name = luaL_checkstring(L, 1);
    lua_getfield(L, lua_upvalueindex(1), "path");
    const char *path = lua_tostring(L, -1);
    if (path == NULL) return luaL_error(L, "'package.path' must be a string");
    const char *mod = luaL_gsub(L, name, ".", "/");
    buf miss = BUF_INIT;   /* "no file 'a'\n\tno file 'b'": require adds the first "\n\t" */
    while (*path) {
        const char *end = strchr(path, ';');
        size_t n = end ? (size_t)(end - path) : strlen(path);
        if (n > 0) {
            lua_pushlstring(L, path, n);
            const char *file = luaL_gsub(L, lua_tostring(L, -1), "?", mod);
            const char *rel = host_relative(L, file);
            if (host_load_compiled(L, file, rel)) {
                buf_free(&miss);
                lua_pushstring(L, rel);   /* second argument to the loader, as in Lua */
                return 2;
            }
            buf src = BUF_INIT;
            if (buf_read_file(&src, file) == 0) {
                buf_free(&miss);
                lua_pushfstring(L, "@%s", rel);
                int st = luaL_loadbufferx(L, buf_cstr(&src), src.len, lua_tostring(L, -1), "t");
                buf_free(&src);
                if (st != LUA_OK)
                    return luaL_error(L, "error loading module '%s' from file '%s':\n\t%s",
                                      name, rel, lua_tostring(L, -1));
                lua_pushstring(L, rel);   /* second argument to the loader, as in Lua */
                return 2;
            }
            buf_free(&src);
            buf_addf(&miss, "%sno file '%s'", miss.len ? "\n\t" : "", rel);
            lua_pop(L, 2);
        }
        if (end == NULL) break;
        path = end + 1;
    }
    lua_pushlstring(L, buf_cstr(&miss), miss.len);
    buf_free(&miss);
    return 1;
}

/* -- Module `host` ----------------------------------------------------------------------- */

static int host_fail(lua_State *L, const char *fmt, const char *a, const char *b)
{
    int e = errno;
    lua_pushnil(L);
    if (b) lua_pushfstring(L, fmt, a, b, strerror(e));
    else lua_pushfstring(L, fmt, a, strerror(e));
    return 2;
}

/*
** host.root() -> the repository root (absolute). For opening files only: never print it or
** write it into output.
*/
static int l_root(lua_State *L)
{
    lua_pushstring(L, host_root(L));
    return 1;
}

/*
** host.mkdir_p(path) -> true | nil, "cannot create directory 'p': why". Creates 'path' and
** its missing parents (like mkdir -p); an existing directory is fine.
*/
static int l_mkdir_p(lua_State *L)
{
    size_t n;
    const char *path = luaL_checklstring(L, 1, &n);
    if (n == 0) {
        errno = ENOENT;
        return host_fail(L, "cannot create directory '%s': %s", path, NULL);
    }
    char *p = xmalloc(n + 1);
    memcpy(p, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        struct stat st;
        if (mkdir(p, 0777) != 0 && !(errno == EEXIST && stat(p, &st) == 0 && S_ISDIR(st.st_mode))) {
            if (errno == EEXIST) errno = ENOTDIR;
            int e = errno;
            lua_pushnil(L);
            lua_pushfstring(L, "cannot create directory '%s': %s", p, strerror(e));
            free(p);
            return 2;
        }
        p[i] = c;
    }
    free(p);
    lua_pushboolean(L, 1);
    return 1;
}

/*
** host.rename(from, to) -> true | nil, "cannot rename 'from' to 'to': why". Atomic within
** one file system: the way emit writes a file whole or not at all.
*/
static int l_rename(lua_State *L)
{
    const char *from = luaL_checkstring(L, 1);
    const char *to = luaL_checkstring(L, 2);
    if (rename(from, to) != 0) return host_fail(L, "cannot rename '%s' to '%s': %s", from, to);
    lua_pushboolean(L, 1);
    return 1;
}

/*
** host.exists(path) -> whether anything (file, directory, ...) is at 'path'.
*/
static int l_exists(lua_State *L)
{
    struct stat st;
    lua_pushboolean(L, stat(luaL_checkstring(L, 1), &st) == 0);
    return 1;
}

/*
** host.is_dir(path) -> whether 'path' is a directory (following symbolic links).
*/
static int l_is_dir(lua_State *L)
{
    struct stat st;
    lua_pushboolean(L, stat(luaL_checkstring(L, 1), &st) == 0 && S_ISDIR(st.st_mode));
    return 1;
}

/*
** host.clock() -> seconds (float) on a monotonic clock; only differences mean anything.
*/
static int l_clock(lua_State *L)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
    return 1;
}

/*
** host.peak_rss_kb() -> the process's peak resident set size in KiB (for benchmarks).
*/
static int l_peak_rss_kb(lua_State *L)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return luaL_error(L, "getrusage: %s", strerror(errno));
    lua_pushinteger(L, (lua_Integer)ru.ru_maxrss);
    return 1;
}

/*
** host.mem_limit(bytes | nil) -> previous cap (integer) or nil. Caps the memory the Lua state
** may hold: an allocation that would exceed it fails and Lua raises "not enough memory".
** nil removes the cap. Used while evaluating sandboxed model files; remove it afterwards.
*/
static int l_mem_limit(lua_State *L)
{
    size_t limit = 0;
    if (!lua_isnoneornil(L, 1)) {
        lua_Integer n = luaL_checkinteger(L, 1);
        luaL_argcheck(L, n > 0, 1, "the cap must be a positive number of bytes (or nil)");
        limit = (size_t)n;
    }
    size_t old = host_set_mem_limit(L, limit);
    if (old == 0) lua_pushnil(L);
    else lua_pushinteger(L, (lua_Integer)old);
    return 1;
}

/*
** host.cpu_deadline(seconds | nil): once the process's CPU time (os.clock()) passes 'seconds',
** allocations that grow memory fail and Lua raises "not enough memory" (the caller tells the
** two apart with os.clock()); checked every HOST_CLOCK_EVERY bytes. nil removes the deadline.
** Used while evaluating sandboxed model files; remove it afterwards.
*/
static int l_cpu_deadline(lua_State *L)
{
    host_mem *m = host_getmem(L);
    double t = 0;
    if (!lua_isnoneornil(L, 1)) {
        t = (double)luaL_checknumber(L, 1);
        luaL_argcheck(L, t > 0, 1, "the deadline must be a positive CPU time (or nil)");
    }
    m->deadline = t;
    m->grown = 0;
    m->late = 0;
    return 0;
}

/*
** host.mem_used() -> bytes currently allocated by the Lua state.
*/
static int l_mem_used(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)host_getmem(L)->used);
    return 1;
}

static const luaL_Reg host_funcs[] = {
    {"root", l_root},
    {"mkdir_p", l_mkdir_p},
    {"rename", l_rename},
    {"exists", l_exists},
    {"is_dir", l_is_dir},
    {"clock", l_clock},
    {"peak_rss_kb", l_peak_rss_kb},
    {"mem_limit", l_mem_limit},
    {"mem_used", l_mem_used},
    {"cpu_deadline", l_cpu_deadline},
    {NULL, NULL}
};

/*
** Open the module `host` (require("host")): a table of the functions above.
*/
int luaopen_host(lua_State *L)
{
    luaL_newlib(L, host_funcs);
    return 1;
}

/* -- State setup ------------------------------------------------------------------------- */

/*
** Prepare L (from host_newstate) for the generator: standard libraries; the repository root;
** package.path = "<root>/gen/lua/?.lua", package.cpath = "" and searchers limited to preload
** and host_searcher; modules `host` and `tmpl` in package.loaded (not globals). Raises a Lua
** error on failure, so call it under protection (main.c's pmain). Returns 0.
*/
int host_open(lua_State *L)
{
    luaL_openlibs(L);
    host_push_root(L);
    const char *root = lua_tostring(L, -1);
    lua_pushfstring(L, "%s/gen/lua", root);
    struct stat st;
    if (stat(lua_tostring(L, -1), &st) != 0 || !S_ISDIR(st.st_mode))
        luaL_error(L, "cannot find the generator's Lua passes (gen/lua/ beside build/)");
    lua_pop(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, HOST_ROOT_KEY);

    lua_getglobal(L, "package");
    lua_pushfstring(L, "%s/gen/lua/?.lua", host_root(L));
    lua_setfield(L, -2, "path");
    lua_pushliteral(L, "");
    lua_setfield(L, -2, "cpath");
    lua_createtable(L, 2, 0);                 /* new package.searchers */
    lua_getfield(L, -2, "searchers");
    lua_rawgeti(L, -1, 1);                    /* keep Lua's preload searcher */
    lua_rawseti(L, -3, 1);
    lua_pop(L, 1);
    lua_pushvalue(L, -2);
    lua_pushcclosure(L, host_searcher, 1);
    lua_rawseti(L, -2, 2);
    lua_setfield(L, -2, "searchers");
    lua_pop(L, 1);

    luaL_requiref(L, "host", luaopen_host, 0);
    luaL_requiref(L, "tmpl", luaopen_tmpl, 0);
    luaL_requiref(L, "tables", luaopen_tables, 0);
    lua_pop(L, 3);
    return 0;
}
