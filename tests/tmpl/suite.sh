#!/bin/bash
# tests/tmpl/suite.sh: the template engine (gen/tmpl.c, gen/tmpl_lex.re) and the generator's
# C host (gen/main.c, gen/host.c): command line, error reporting, module `host`.
# Protocol: DESIGN.md 3 (one PASS/FAIL/SKIP line per test). Scratch files: build/test/tmpl/.
#   render/<case>  tests/tmpl/cases/<case>.tmpl + <case>.env.lua -> exactly <case>.out
#   error/<case>   tests/tmpl/cases/<case>.tmpl + errors.env.lua -> first stderr line and exit
#                  status as in <case>.err ("exit N" on its second line); whole stderr when
#                  <case>.stderr exists
#   cli/<name>     build/gen arguments, scripts in tests/tmpl/cli/
. "$(dirname "$0")/../lib.sh" tmpl
C=tests/tmpl/cases
G=build/gen
if ! make -s build/gen > "$S/make.log" 2>&1; then
    fail build "make build/gen failed:"
    tail -n 20 "$S/make.log"
    finish
fi

# run NAME CMD...: stdout -> $out, stderr -> $err, status -> $rc
run() {
    f=$(echo "$1" | tr / _)
    out=$S/$f.stdout
    err=$S/$f.stderr
    shift
    "$@" > "$out" 2> "$err"
    rc=$?
}

# expect NAME RC FIRST_STDERR_LINE: after run; an empty FIRST_STDERR_LINE wants no stderr
expect() {
    got=$(head -n 1 "$err")
    if [ "$rc" -ne "$2" ]; then
        fail "$1" "exit $rc, expected $2 (stderr: $got)"
    elif [ "$got" != "$3" ]; then
        fail "$1" "stderr starts '$got', expected '$3'"
    else
        pass "$1"
    fi
}

# -- render cases ------------------------------------------------------------------------------
for want in "$C"/*.out; do
    name=$(basename "$want" .out)
    env=$C/$name.env.lua
    [ -f "$env" ] || env=
    run "render/$name" "$G" --lua tests/tmpl/render.lua "$C/$name.tmpl" "$env"
    if [ "$rc" -ne 0 ]; then
        fail "render/$name" "exit $rc: $(head -n 1 "$err")"
    elif [ -s "$err" ]; then
        fail "render/$name" "unexpected stderr: $(head -n 1 "$err")"
    elif ! cmp -s "$want" "$out"; then
        fail "render/$name" "output differs: diff $want $out"
    else
        pass "render/$name"
    fi
done

# -- error cases -------------------------------------------------------------------------------
for spec in "$C"/*.err; do
    name=$(basename "$spec" .err)
    line=$(sed -n 1p "$spec")
    want_rc=$(sed -n 2p "$spec" | sed 's/^exit //')
    test=error/${name#err_}
    run "$test" "$G" --lua tests/tmpl/render.lua "$C/$name.tmpl" "$C/errors.env.lua"
    if [ -f "$C/$name.stderr" ] && [ "$rc" -eq "$want_rc" ] && ! cmp -s "$C/$name.stderr" "$err"
    then
        fail "$test" "stderr differs: diff $C/$name.stderr $err"
    else
        expect "$test" "$want_rc" "$line"
    fi
done

# -- command line ------------------------------------------------------------------------------
run cli/help "$G" --help
if [ "$rc" -ne 0 ] || [ -s "$err" ]; then
    fail cli/help "exit $rc, stderr: $(head -n 1 "$err")"
elif [ "$(head -n 1 "$out" | cut -c 1-26)" != "usage: gen [options] MODEL" ]; then
    fail cli/help "first line: $(head -n 1 "$out")"
elif awk 'length($0) > 80 { exit 1 }' "$out"; then
    missing=
    for o in tp pp dp cp ep etp vp order first-layers last-layers mbs nmb seq sp dist-opt out \
             print-out inspect rank dump check line-dirs; do
        grep -q -- "^  --$o " "$out" || missing="$missing --$o"
    done
    if [ -n "$missing" ]; then fail cli/help "options not listed:$missing"; else pass cli/help; fi
else
    fail cli/help "a line is longer than 80 columns"
fi
cp "$out" "$S/help.txt"

run cli/help-short "$G" -h
if [ "$rc" -eq 0 ] && cmp -s "$out" "$S/help.txt"; then pass cli/help-short
else fail cli/help-short "exit $rc or output differs from --help"; fi

run cli/help-after-options "$G" --tp 2 tiny --help
if [ "$rc" -eq 0 ] && cmp -s "$out" "$S/help.txt"; then pass cli/help-after-options
else fail cli/help-after-options "exit $rc or output differs from --help"; fi

run cli/unknown-option "$G" --bogus tiny
if [ "$rc" -eq 2 ] && [ "$(cat "$err")" = "gen: usage error: unknown option '--bogus'
try 'gen --help'" ] && [ ! -s "$out" ]; then pass cli/unknown-option
else fail cli/unknown-option "exit $rc, stderr: $(head -n 1 "$err")"; fi

run cli/unknown-option-value "$G" --bogus=3 tiny
expect cli/unknown-option-value 2 "gen: usage error: unknown option '--bogus'"

run cli/unknown-short "$G" -x tiny
expect cli/unknown-short 2 "gen: usage error: unknown option '-x'"

run cli/bad-int "$G" --tp x tiny
expect cli/bad-int 2 "gen: usage error: option '--tp' needs a non-negative decimal integer, got 'x'"

run cli/bad-int-negative "$G" tiny --pp=-1
expect cli/bad-int-negative 2 \
    "gen: usage error: option '--pp' needs a non-negative decimal integer, got '-1'"

run cli/bad-int-empty "$G" tiny --mbs=
expect cli/bad-int-empty 2 \
    "gen: usage error: option '--mbs' needs a non-negative decimal integer, got ''"

run cli/bad-int-trailing "$G" tiny --rank 3x
expect cli/bad-int-trailing 2 \
    "gen: usage error: option '--rank' needs a non-negative decimal integer, got '3x'"

big=99999999999999999999
run cli/bad-int-overflow "$G" tiny --seq $big
expect cli/bad-int-overflow 2 \
    "gen: usage error: option '--seq' needs a non-negative decimal integer, got '$big'"

run cli/missing-value "$G" tiny --order
expect cli/missing-value 2 "gen: usage error: option '--order' needs a value (S)"

run cli/flag-value "$G" tiny --sp=1
expect cli/flag-value 2 "gen: usage error: option '--sp' takes no value"

run cli/two-models "$G" tiny gpt2
expect cli/two-models 2 "gen: usage error: unexpected argument 'gpt2' (MODEL is already 'tiny')"

# opts as driver.run receives them, through a stand-in driver
run cli/opts "$G" --driver tests/tmpl/cli/echo_driver.lua --tp 8 --pp=2 --sp --order tp-dp-pp \
    --first-layers 3 --dist-opt --line-dirs --rank=0 --out out/x --dump topology tiny --check \
    --print-out --inspect --dp 1 --cp 2 --ep 4 --etp 2 --vp 3 --last-layers 0 --mbs 1 \
    --nmb 16 --seq 1024
cat > "$S/opts.want" <<'EOF'
check = true (boolean)
cp = 2 (integer)
dist_opt = true (boolean)
dp = 1 (integer)
dump = topology (string)
ep = 4 (integer)
etp = 2 (integer)
first_layers = 3 (integer)
inspect = true (boolean)
last_layers = 0 (integer)
line_dirs = true (boolean)
mbs = 1 (integer)
model = tiny (string)
nmb = 16 (integer)
order = tp-dp-pp (string)
out = out/x (string)
pp = 2 (integer)
print_out = true (boolean)
rank = 0 (integer)
seq = 1024 (integer)
sp = true (boolean)
tp = 8 (integer)
vp = 3 (integer)
EOF
if [ "$rc" -eq 0 ] && [ ! -s "$err" ] && cmp -s "$S/opts.want" "$out"; then pass cli/opts
else fail cli/opts "exit $rc or opts differ: diff $S/opts.want $out"; fi

run cli/double-dash "$G" --driver tests/tmpl/cli/echo_driver.lua --tp 2 -- --odd-model
if [ "$rc" -eq 0 ] && [ "$(cat "$out")" = "model = --odd-model (string)
tp = 2 (integer)" ]; then pass cli/double-dash
else fail cli/double-dash "exit $rc: $(head -n 1 "$out") $(head -n 1 "$err")"; fi

run cli/opts-last-wins "$G" --driver tests/tmpl/cli/echo_driver.lua --tp 2 --tp=4 tiny
if [ "$rc" -eq 0 ] && [ "$(cat "$out")" = "model = tiny (string)
tp = 4 (integer)" ]; then pass cli/opts-last-wins
else fail cli/opts-last-wins "exit $rc: $(head -n 1 "$out")"; fi

run cli/driver-user-error "$G" --driver tests/tmpl/cli/echo_driver.lua user-error
if [ "$rc" -eq 1 ] && [ "$(cat "$err")" = \
    "models/tiny.lua:7: error: 'n_head' (12) must divide 'channels' (100)
gen: error: no output written" ]; then pass cli/driver-user-error
else fail cli/driver-user-error "exit $rc: $(head -n 1 "$err")"; fi

run cli/no-driver-file "$G" --driver tests/tmpl/cli/missing_driver.lua tiny
expect cli/no-driver-file 3 \
    "gen: internal error: cannot open tests/tmpl/cli/missing_driver.lua: No such file or directory"

# --lua scripts and the reporting path
run cli/lua-args "$G" --lua tests/tmpl/cli/args.lua one "two words" --tp
if [ "$rc" -eq 0 ] && [ "$(cat "$out")" = "arg[0]=tests/tmpl/cli/args.lua arg[1]=one arg[2]=two words arg[3]=--tp
...=one,two words,--tp" ]; then pass cli/lua-args
else fail cli/lua-args "exit $rc: $(head -n 1 "$out") $(head -n 1 "$err")"; fi

run cli/lua-missing-file "$G" --lua
expect cli/lua-missing-file 2 "gen: usage error: option '--lua' needs a Lua file"

run cli/user-error "$G" --lua tests/tmpl/cli/raise.lua located
if [ "$rc" -eq 1 ] && [ ! -s "$out" ] && [ "$(cat "$err")" = \
    "models/tiny.lua:7: error: 'n_head' (12) must divide 'channels' (100)
gen: error: no output written" ]; then pass cli/user-error
else fail cli/user-error "exit $rc: $(head -n 1 "$err")"; fi

run cli/user-error-list "$G" --lua tests/tmpl/cli/raise.lua list
if [ "$rc" -eq 1 ] && [ "$(cat "$err")" = "models/tiny.lua:3: error: first problem
models/tiny.lua: error: second problem (no line)
gen: error: third problem (no file)
gen: error: no output written" ]; then pass cli/user-error-list
else fail cli/user-error-list "exit $rc: $(head -n 1 "$err")"; fi

run cli/user-error-nofile "$G" --lua tests/tmpl/cli/raise.lua nofile
expect cli/user-error-nofile 1 "gen: error: --tp 3 does not divide 64 heads"

run cli/user-error-caret "$G" --lua tests/tmpl/cli/raise.lua caret
if [ "$rc" -eq 1 ] && [ "$(cat "$err")" = "models/x.lua:2: error: not an integer
n = 12.5
    ^ near here
gen: error: no output written" ]; then pass cli/user-error-caret
else fail cli/user-error-caret "exit $rc: $(cat "$err")"; fi

run cli/internal-error "$G" --lua tests/tmpl/cli/raise.lua string
if [ "$rc" -eq 3 ] \
    && [ "$(head -n 1 "$err")" = "gen: internal error: tests/tmpl/cli/raise.lua:5: boom" ] \
    && grep -q '^stack traceback:' "$err" \
    && grep -q "tests/tmpl/cli/raise.lua:5: in local 'boom'" "$err" \
    && ! grep -q 'no output written' "$err"; then pass cli/internal-error
else fail cli/internal-error "exit $rc: $(head -n 1 "$err")"; fi

run cli/internal-table "$G" --lua tests/tmpl/cli/raise.lua table
if [ "$rc" -eq 3 ] && grep -q '^stack traceback:' "$err"; then
    expect cli/internal-table 3 \
        "gen: internal error: (error object is a table that is not a user error {file=, line=, msg=})"
else fail cli/internal-table "exit $rc or no traceback"; fi

run cli/internal-tostring "$G" --lua tests/tmpl/cli/raise.lua tostring
expect cli/internal-tostring 3 "gen: internal error: custom object"

run cli/internal-empty-list "$G" --lua tests/tmpl/cli/raise.lua empty-list
expect cli/internal-empty-list 3 \
    "gen: internal error: (error object is a table that is not a user error {file=, line=, msg=})"

run cli/out-of-memory "$G" --lua tests/tmpl/cli/raise.lua nomem
expect cli/out-of-memory 3 "gen: internal error: not enough memory"

run cli/no-error "$G" --lua tests/tmpl/cli/raise.lua none
if [ "$rc" -eq 0 ] && [ "$(cat "$out")" = "no error raised for none" ]; then pass cli/no-error
else fail cli/no-error "exit $rc"; fi

# any current directory: the root comes from the executable's location
mkdir -p "$S/elsewhere"
up=$(realpath --relative-to="$S/elsewhere" .)     # the root, relative (any TEST_SCRATCH)
run cli/any-cwd sh -c "cd $S/elsewhere && $up/build/gen --lua $up/tests/tmpl/cli/cwd.lua"
if [ "$rc" -eq 0 ] && cmp -s "$C/include.out" "$out"; then pass cli/any-cwd
else fail cli/any-cwd "exit $rc: $(head -n 1 "$err")"; fi

# the passes' precompiled forms (gen/host.c host_load_compiled), in a root of their own: a
# current build/obj/gen/lua/X.luac is loaded in place of gen/lua/X.lua; an older one, or one
# that does not load, is not
if command -v luac5.4 > /dev/null 2>&1; then
    T=$S/root
    rm -rf "$T" && mkdir -p "$T/build/obj/gen/lua" "$T/gen/lua" "$T/src" &&
        cp "$G" "$T/build/gen" &&
        echo 'return "source"' > "$T/gen/lua/probe.lua" &&
        echo 'return "compiled"' > "$T/src/probe.lua" &&
        echo 'print((require("probe")))' > "$T/main.lua" &&
        luac5.4 -o "$T/build/obj/gen/lua/probe.luac" "$T/src/probe.lua" &&
        touch -d '2001-01-01' "$T/gen/lua/probe.lua"
    run cli/compiled-current "$T/build/gen" --lua "$T/main.lua"
    if [ "$rc" -eq 0 ] && [ "$(cat "$out")" = compiled ]; then pass cli/compiled-current
    else fail cli/compiled-current "exit $rc, printed '$(cat "$out")': $(head -n 1 "$err")"; fi
    touch "$T/gen/lua/probe.lua"                    # the source edited since
    run cli/compiled-stale "$T/build/gen" --lua "$T/main.lua"
    if [ "$rc" -eq 0 ] && [ "$(cat "$out")" = source ]; then pass cli/compiled-stale
    else fail cli/compiled-stale "exit $rc, printed '$(cat "$out")': $(head -n 1 "$err")"; fi
    echo 'not bytecode' > "$T/build/obj/gen/lua/probe.luac"     # newer, but does not load
    run cli/compiled-bad "$T/build/gen" --lua "$T/main.lua"
    if [ "$rc" -eq 0 ] && [ "$(cat "$out")" = source ]; then pass cli/compiled-bad
    else fail cli/compiled-bad "exit $rc, printed '$(cat "$out")': $(head -n 1 "$err")"; fi
else
    skip cli/compiled "no luac5.4 (Debian's lua5.4)"
fi

# -- Lua-level API tests -------------------------------------------------------------------------
for t in api host; do
    run "lua/$t" "$G" --lua "tests/tmpl/cli/$t.lua"
    if [ "$rc" -eq 0 ] && [ "$(tail -n 1 "$out")" = OK ]; then pass "lua/$t"
    else fail "lua/$t" "exit $rc: $(head -n 1 "$err")"; fi
done

run lua/needs-once "$G" --lua tests/tmpl/cli/twice.lua
if [ "$rc" -eq 0 ] && [ "$(cat "$err")" = \
    "tests/tmpl/cases/err_needs.tmpl:1: warning: 'unused_a' declared in needs: but never used
tests/tmpl/cases/err_needs.tmpl:2: warning: 'unused_b' declared in needs: but never used" ]
then pass lua/needs-once
else fail lua/needs-once "exit $rc, stderr: $(cat "$err" | tr '\n' '|')"; fi

finish
