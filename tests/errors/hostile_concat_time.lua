-- 48 MiB made again and again by one instruction (..), which the hook cannot split
local a = ("x"):rep(1 << 24)
local n = 0; while true do local s = a .. a .. a; n = n + 1 end
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
