-- args.lua: prints what a --lua script receives (global arg and ...).
local parts = {}
for i = 0, #arg do parts[#parts + 1] = ("arg[%d]=%s"):format(i, arg[i]) end
print(table.concat(parts, " "))
print("...=" .. table.concat({ ... }, ","))
