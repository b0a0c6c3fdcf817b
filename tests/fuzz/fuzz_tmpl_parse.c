/*
** fuzz_tmpl_parse.c: harness for the template compiler (gen/tmpl.c, tmpl_compile_source):
** compiles the input as a template (includes unchecked: no root). A rejected template must
** say why; an accepted one must compile to Lua that loads, as tmpl.c promises.
*/
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lualib.h>

#include "fuzz.h"   // defines: LLVMFuzzerTestOneInput, fz_bug
#include "tmpl.h"   // defines: tmpl_compile_source, tmpl_error

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = 0;
    buf lua;
    buf_init(&lua);
    tmpl_error err;
    if (tmpl_compile_source("templates/fuzz.tmpl", src, size, NULL, &lua, &err, 0) != 0) {
        if (!err.msg[0]) fz_bug("a template rejected without a message");
        if (err.bol && (err.bol < src || err.bol + err.bol_len > src + size))
            fz_bug("the error's source line lies outside the template");
    } else {
        lua_State *L = luaL_newstate();
        if (!L) fz_bug("no Lua state");
        if (luaL_loadbufferx(L, buf_cstr(&lua), lua.len, "@templates/fuzz.tmpl", "t") != LUA_OK)
            fz_bug("the generated Lua does not load: %s", lua_tostring(L, -1));
        lua_close(L);
    }
    buf_free(&lua);
    free(src);
    return 0;
}
