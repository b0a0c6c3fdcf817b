tests/errors/hostile_nesting_expr.lua
