local xs = {}
for i = 1, 20 do xs[i] = i * i end
return { xs = xs, none = {}, grid = { { 1, 2 }, { 3, 4 } } }
