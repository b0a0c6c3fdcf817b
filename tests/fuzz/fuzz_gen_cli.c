/*
** fuzz_gen_cli.c: harness for the generator's command line (gen/main.c: parse_args and
** push_opts, compiled into this file; gen's own main is renamed and not run, so nothing is
** generated or written). The input is the argument list, words separated by NUL bytes. A
** usage error (exit 2) is a normal outcome; an accepted command line must become the `opts`
** table driver.run gets.
*/
#include <stdio.h>

#define main gen_main
int gen_main(int argc, char **argv);
#include "main.c"
#undef main

#include <lualib.h>

#include "fuzz.h"   // defines: LLVMFuzzerTestOneInput, fz_bug

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char *argv[FZ_MAX_ARGS + 1];
    char *text;
    int argc = fz_argv(data, size, "gen", argv, &text);
    gen_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc < 0 || rc > 2) fz_bug("parse_args returned %d", rc);
    if (rc == 0 && a.mode == MODE_DRIVER) {
        lua_State *L = luaL_newstate();
        if (!L) fz_bug("no Lua state");
        push_opts(L, &a);
        if (!lua_istable(L, -1) || lua_gettop(L) != 1) fz_bug("push_opts left no table");
        if (a.model && (lua_getfield(L, 1, "model") != LUA_TSTRING ||
                        strcmp(lua_tostring(L, -1), a.model)))
            fz_bug("opts.model is not MODEL");
        lua_close(L);
    }
    free(text);
    return 0;
}
