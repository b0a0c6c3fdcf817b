#!/bin/bash
# tests/program/suite.sh: the generated program against the generator's own records.
#   groups/<layout>   the groups every rank builds at start-up from the grid description
#                     (train --show-groups) are topology.json's, member for member, in order
#   trace/<layout>    what every rank communicates (the runtime's RT_TRACE) is what the generator
#                     declared (--dump program: every collective of every call and of the step's
#                     tail, every pipeline message), in order, for two steps
#   sites/<layout>    every one of those calls (RT_TRACE_SITES: each call's return address,
#                     mapped by addr2line) is made at a line of the rank's stage<k>.c that names
#                     the rt_ call (tests/program/sites_check.lua): the source shows it all
#   dump/<pass>       build/gen --dump schedule and --dump program print the records as JSON
# Scratch: build/test/program/. Run: tests/run.sh program
. "$(dirname "$0")/../lib.sh" program

if ! make -s --no-print-directory build/gen build/libgpt_cpu.a build/librt_cpu.a \
        build/tools/tokenize > "$S/make.log" 2>&1; then
    fail setup "make build/gen libgpt_cpu.a librt_cpu.a tokenize failed: $(tail -n 1 "$S/make.log")"
    finish
fi
# a token file for tiny's vocabulary of 256 (byte tokens of the sources here)
TOKENS=$S/tokens.bin
build/tools/tokenize -o "$TOKENS" README.md docs/*.md > /dev/null 2>&1 || {
    fail setup "cannot make a token file"
    finish
}

# name | world | gen arguments: dense and MoE grids, a rank order other than the default
while IFS='|' read -r name world args; do
    [ -z "$name" ] && continue
    d=$S/$name
    # shellcheck disable=SC2086 # the generator arguments are words without spaces
    if ! gen_build "$d" $args; then
        fail "groups/$name" "$WHY"
        continue
    fi
    if ! RUN_TIMEOUT=60 run_prog "$d/train" "$world" "$d.groups.txt" --show-groups; then
        fail "groups/$name" "train --show-groups failed: $(tail -n 1 "$d.groups.txt")"
    elif why=$(build/gen --lua tests/program/groups_check.lua "$d/topology.json" \
                   "$d.groups.txt" 2>&1); then
        pass "groups/$name"
    else
        fail "groups/$name" "$(echo "$why" | head -n 1)"
    fi
done <<'LAYOUTS'
tiny-tp2-pp2-dp2|8|tiny --tp 2 --pp 2 --dp 2
tiny-order-tp-pp-dp|8|tiny --tp 2 --pp 2 --dp 2 --order tp-pp-dp
tiny_moe-tp2-dp2-ep2|4|tiny_moe --tp 2 --dp 2 --ep 2 --sp
tiny_moe-tp2-pp2-etp1-ep2|8|tiny_moe --tp 2 --pp 2 --dp 2 --ep 2 --etp 1 --sp
tiny-tp2-cp2-dp2|8|tiny --tp 2 --cp 2 --dp 2
LAYOUTS

# trace/<layout>: what each rank communicates (RT_TRACE) is what --dump program declares, for
# two steps: dense TP/SP/PP/DP with the distributed optimizer, interleaved, and MoE with EP
while IFS='|' read -r name world args; do
    [ -z "$name" ] && continue
    d=$S/trace-$name
    mkdir -p "$d/trace"
    # shellcheck disable=SC2086
    if ! gen_build "$d/out" $args; then
        fail "trace/$name" "$WHY"
        continue
    fi
    if ! build/gen $args --dump program > "$d/program.json" 2> "$d.dump.txt"; then
        fail "trace/$name" "--dump program failed: $(head -n 1 "$d.dump.txt")"
        continue
    fi
    if ! RT_TRACE=$d/trace RT_TRACE_SITES=1 RUN_TIMEOUT=120 run_prog "$d/out/train" "$world" \
            "$d.run.txt" --data "$TOKENS" --steps 2 --quiet; then
        fail "trace/$name" "training failed: $(grep -m1 -i 'error\|rank' "$d.run.txt")"
        continue
    elif why=$(build/gen --lua tests/program/trace_check.lua "$d/program.json" "$d/trace" \
                   "$world" 2 2>&1); then
        pass "trace/$name"
    else
        fail "trace/$name" "$(echo "$why" | head -n 1)"
    fi
    # sites/<layout>: each of those calls is a line of the rank's stage source naming it
    if why=$(build/gen --lua tests/program/sites_check.lua "$d/program.json" "$d/trace" \
                 "$world" "$d/out" 2>&1); then
        pass "sites/$name"
    else
        fail "sites/$name" "$(echo "$why" | head -n 1)"
    fi
done <<'LAYOUTS'
tiny-tp2-pp2-dp2-sp-distopt|8|tiny --tp 2 --pp 2 --dp 2 --sp --dist-opt --nmb 2
tiny-pp2-vp2-dp2|4|tiny --pp 2 --vp 2 --dp 2 --nmb 4
tiny_moe-tp2-dp2-ep2-sp|4|tiny_moe --tp 2 --dp 2 --ep 2 --sp
tiny_moe-tp2-pp2-etp1-ep2|8|tiny_moe --tp 2 --pp 2 --dp 2 --ep 2 --etp 1 --sp --vp 2 --nmb 2
tiny-tp2-cp2-pp2-sp-rc|8|tiny --tp 2 --cp 2 --pp 2 --sp --nmb 2 --recompute selective
tiny-cp4-bf16|4|tiny --cp 4 --bf16
tiny_moe-cp2-ep2|4|tiny_moe --cp 2 --dp 2 --ep 2
tiny-tp2-cp2-a2a-sp-rc|4|tiny --tp 2 --cp 2 --cp-comm a2a --sp --recompute selective
LAYOUTS

# control: a trace with one collective missing (the first reduce-scatter) is caught
d=$S/trace-tiny-tp2-pp2-dp2-sp-distopt
if [ -f "$d/trace/rank_00003.trace" ]; then
    mkdir -p "$d/control"
    cp "$d"/trace/*.trace "$d/control/"
    sed -i '0,/^reduce_scatter dp-cp/{/^reduce_scatter dp-cp/d}' "$d/control/rank_00003.trace"
    if ! cmp -s "$d/trace/rank_00003.trace" "$d/control/rank_00003.trace" &&
       ! build/gen --lua tests/program/trace_check.lua "$d/program.json" "$d/control" 8 2 \
            > /dev/null 2>&1; then
        pass trace/control-missing-collective-caught
    else
        fail trace/control-missing-collective-caught "a missing collective went unnoticed"
    fi
fi

# control: a step's collective made from the library (the site of a start-up check) is caught
if [ -f "$d/trace/rank_00003.trace" ]; then
    mkdir -p "$d/control-site"
    cp "$d"/trace/*.trace "$d/control-site/"
    lib_site=$(sed -n '1s/.* at //p' "$d/trace/rank_00003.trace")
    sed -i "0,/^reduce_scatter dp-cp.* at /s/^\(reduce_scatter dp-cp.*\) at .*/\1 at $lib_site/" \
        "$d/control-site/rank_00003.trace"
    if ! cmp -s "$d/trace/rank_00003.trace" "$d/control-site/rank_00003.trace" &&
       ! build/gen --lua tests/program/sites_check.lua "$d/program.json" "$d/control-site" 8 \
            "$d/out" > /dev/null 2>&1; then
        pass sites/control-library-call-caught
    else
        fail sites/control-library-call-caught "a collective made outside the stage source " \
             "went unnoticed"
    fi
fi

# control: a group listed in another order (group ranks swapped) is caught
d=$S/tiny-tp2-pp2-dp2
if [ -f "$d.groups.txt" ]; then
    sed 's/^rank 0: tp 0,1$/rank 0: tp 1,0/' "$d.groups.txt" > "$d.control.txt"
    if grep -q '^rank 0: tp 1,0$' "$d.control.txt" &&
       ! build/gen --lua tests/program/groups_check.lua "$d/topology.json" "$d.control.txt" \
            > /dev/null 2>&1; then
        pass groups/control-swapped-members-caught
    else
        fail groups/control-swapped-members-caught "a wrong member order went unnoticed"
    fi
fi

# --dump schedule / program: JSON (the generator's own encoder; checked well formed by the
# harness's reader) holding the records
for pass_ in schedule program; do
    if build/gen tiny --tp 2 --pp 2 --nmb 2 --dump $pass_ > "$S/dump-$pass_.json" 2>&1 &&
       build/gen --lua tests/program/json_check.lua "$S/dump-$pass_.json" $pass_ \
            > "$S/dump-$pass_.txt" 2>&1; then
        pass "dump/$pass_"
    else
        fail "dump/$pass_" "$(head -n 1 "$S/dump-$pass_.txt" "$S/dump-$pass_.json" | head -n 2)"
    fi
done
finish
