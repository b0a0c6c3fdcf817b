-- tries to leave a finalizer behind (it would run outside the sandbox)
local t = setmetatable({}, { __gc = function() while true do end end })
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
