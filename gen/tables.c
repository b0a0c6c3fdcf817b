/*
** tables.c: the Lua module `tables`: the lists the generator shares with the training library,
** read from lib/gpt_tables.h (the communicators, the layer's tensor fields with the role names
** seen through each, the memory plan's buffers with their element types and shapes, a MoE
** layer's all-to-alls), so that the Lua passes and the compiled library use one list each.
** Opened by host.c; read by gen/lua/program.lua.
*/
#include <lauxlib.h>
#include <string.h>

#include "host.h"                     // defines: luaopen_tables
#include "../lib/gpt_tables.h"        // defines: GPT_GROUPS, GPT_FIELDS, GPT_MEMS, GPT_A2AS

/* t[#t + 1] = { id = id, <k1> = v1, <k2> = v2, ... }: the record on top of the stack. */
static void add_record(lua_State *L, const char *id)
{
    lua_newtable(L);
    lua_pushstring(L, id);
    lua_setfield(L, -2, "id");
}

static void set_str(lua_State *L, const char *k, const char *v)
{
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

/* The words of s (space-separated) as an array at field k. */
static void set_words(lua_State *L, const char *k, const char *s)
{
    lua_newtable(L);
    int n = 0;
    while (*s) {
        size_t len = strcspn(s, " ");
        if (len > 0) {
            lua_pushlstring(L, s, len);
            lua_rawseti(L, -2, ++n);
        }
        s += len;
        while (*s == ' ') s++;
    }
    lua_setfield(L, -2, k);
}

static void push_group(lua_State *L, int i, const char *id, const char *kind)
{
    add_record(L, id);
    set_str(L, "kind", kind);
    lua_rawseti(L, -2, i);
}

static void push_field(lua_State *L, int i, const char *id, const char *what, const char *roles)
{
    add_record(L, id);
    set_str(L, "what", what);
    set_words(L, "roles", roles);
    lua_rawseti(L, -2, i);
}

static void push_mem(lua_State *L, int i, const char *id, const char *dtype, const char *what,
                     const char *llama)
{
    add_record(L, id);
    set_str(L, "dtype", dtype);
    set_str(L, "what", what);
    set_str(L, "llama", llama);
    lua_rawseti(L, -2, i);
}

int luaopen_tables(lua_State *L)
{
    int i;
    lua_newtable(L);

    lua_newtable(L);
    i = 0;
#define GROUP(id, kind) push_group(L, ++i, #id, kind);
    GPT_GROUPS(GROUP)
#undef GROUP
    lua_setfield(L, -2, "groups");

    lua_newtable(L);
    i = 0;
#define FIELD(id, what, roles) push_field(L, ++i, #id, what, roles);
    GPT_FIELDS(FIELD)
#undef FIELD
    lua_setfield(L, -2, "fields");

    lua_newtable(L);
    i = 0;
#define MEM(id, dtype, what, llama) push_mem(L, ++i, #id, #dtype, what, llama);
    GPT_MEMS(MEM)
#undef MEM
    lua_setfield(L, -2, "mems");

    lua_newtable(L);
    i = 0;
#define A2A(id) lua_pushstring(L, #id); lua_rawseti(L, -2, ++i);
    GPT_A2AS(A2A)
#undef A2A
    lua_setfield(L, -2, "a2as");
    return 1;
}
