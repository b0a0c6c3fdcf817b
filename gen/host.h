/*
** host.h: the generator's Lua state: allocator (with an optional cap), standard libraries,
** module search confined to <root>/gen/lua, and the C modules `host` and `tmpl`.
** Knows nothing about models or options; main.c drives it (lua.c's shape).
** <root> is the repository root, found from the executable (build/gen -> <root>); it is used
** to open files only and is never printed: chunk names and messages use root-relative paths.
*/
#ifndef GEN_HOST_H
#define GEN_HOST_H

#include <stddef.h>

#include <lua.h>

lua_State *host_newstate(void);
int host_open(lua_State *L);
void host_close(lua_State *L);
const char *host_root(lua_State *L);
size_t host_set_mem_limit(lua_State *L, size_t limit);

int luaopen_host(lua_State *L);

/* The module `tables` (tables.c): the lists shared with the library (lib/gpt_tables.h). */
int luaopen_tables(lua_State *L);

#endif
