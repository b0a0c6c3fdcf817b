/*
** fuzz_model.c: harness for the model-description loader: the input is a model file
** (as in models/) run as `build/gen MODEL` runs it, in the generator's Lua state (gen/host.c:
** counting allocator, module path), through the sandbox (gen/lua/sandbox.lua: instruction
** and memory caps) and config.lua's validation (config.model_from_source, config.configure).
** A user error ("models/fuzz.lua:N: error: ...") is a normal outcome; an internal error (a
** Lua error that is not a user error: a generator bug, exit 3 in gen) or running out of
** memory outside the sandbox's cap is a bug. The executable must sit in <root>/build/, as
** build/gen does: host.c finds the repository root from it.
*/
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lualib.h>

#include "fuzz.h"   // defines: LLVMFuzzerTestOneInput, fz_bug
#include "host.h"   // defines: host_newstate, host_open, host_close

static const char loader[] =
    "local src = ...\n"
    "local config = require('config')\n"
    "local model = config.model_from_source(src, 'models/fuzz.lua', 'fuzz')\n"
    "config.configure(model, { model = 'models/fuzz.lua' })\n";

/* A user error, as gen/main.c's is_user_error sees it: {msg = string} or {errors = {...}}. */
static int is_user_error(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx)) return 0;
    int ok = lua_getfield(L, idx, "msg") == LUA_TSTRING ||
             lua_getfield(L, idx, "errors") == LUA_TTABLE;
    lua_settop(L, idx);
    return ok;
}

/* Message handler: user errors pass; anything else gets a traceback for the bug report. */
static int msghandler(lua_State *L)
{
    if (is_user_error(L, 1)) return 1;
    const char *msg = lua_tostring(L, 1);
    luaL_traceback(L, L, msg ? msg : "(an error object that is not a string)", 1);
    return 1;
}

/* Protected: prepare the state as gen does, then load and validate the model. */
static int pmain(lua_State *L)
{
    size_t n;
    const char *src = lua_tolstring(L, 1, &n);
    host_open(L);
    lua_pushcfunction(L, msghandler);
    if (luaL_loadbufferx(L, loader, sizeof loader - 1, "=fuzz_model", "t") != LUA_OK)
        return lua_error(L);
    lua_pushlstring(L, src, n);
    int status = lua_pcall(L, 1, 0, -3);
    if (status == LUA_OK) return 0;
    if (status != LUA_ERRMEM && is_user_error(L, -1)) return 0;
    fz_bug("model loader: %s error: %s", status == LUA_ERRMEM ? "memory" : "internal",
           lua_tostring(L, -1) ? lua_tostring(L, -1) : "(not a string)");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lua_State *L = host_newstate();
    if (!L) fz_bug("cannot create the Lua state");
    lua_pushcfunction(L, pmain);
    lua_pushlstring(L, (const char *)data, size);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK)
        fz_bug("model harness: %s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "?");
    host_close(L);
    return 0;
}
