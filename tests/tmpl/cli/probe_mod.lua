-- probe_mod.lua: a module found through package.path (host.lua checks its chunk name).
return { source = debug.getinfo(1, "S").source, loader_arg = select(2, ...) }
