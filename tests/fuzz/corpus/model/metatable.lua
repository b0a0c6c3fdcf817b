return gpt(setmetatable({}, { __index = function() return 1 end }))
