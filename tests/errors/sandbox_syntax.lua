-- a syntax error
return gpt {
    layers = 4
    hidden = 64,
}
