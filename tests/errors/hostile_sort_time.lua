-- sorting a table of long strings: every comparison reads megabytes, in C
local a, b = ("x"):rep(1 << 22) .. "a", ("x"):rep(1 << 22) .. "b"
local t = {}
for i = 1, 100000 do t[i] = i % 2 == 0 and a or b end
table.sort(t)
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
