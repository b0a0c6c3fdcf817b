#!/bin/bash
# tests/regions/suite.sh: every tensor-parallel region as the generated program runs it, forward
# and backward, against the unsplit computation of the double-precision reference (a worked
# check of each region). Through the layout's generated stage0.c (its static model code, called
# on the stage's buffers of the memory plan): a whole layer (column-parallel c_attn and c_fc,
# row-parallel c_proj, the sequence regions; every activation it keeps, every gradient), the
# vocabulary-parallel embedding and the vocabulary-parallel cross-entropy head. On their own,
# with synthetic inputs: the column- and row-parallel linear and the "f"/"g" and sequence-
# parallel all-gather / reduce-scatter regions (the library's ops between the collectives the
# generated code emits for them). A control: the generated layer with a wrong shard must fail.
# One program per layout (tests/regions/t_regions.c, built by regions.mk against that layout's
# generated sources), run under mpirun with TP ranks; it prints 15 verdicts
# PASS/FAIL regions/<layout>/<region>-<fwd|bwd>. Layouts (f32, DP 1, PP 1): TP 2 with and
# without SP, TP 4 (two ranks hold only vocabulary padding) and the odd-sized model at TP 5
# with SP. Scratch: build/test/regions/.
. "$(dirname "$0")/../lib.sh" regions

if ! make -s --no-print-directory build/gen build/libgpt_cpu.a build/librt_cpu.a ref \
        > "$S/make.log" 2>&1; then
    fail setup "make build/gen libgpt_cpu.a librt_cpu.a ref failed: $(tail -n 1 "$S/make.log")"
    finish
fi

# name, ranks, generator arguments (TP > 1, DP 1, PP 1; MBS 2)
while read -r name np args; do
    [ -z "$name" ] && continue
    out=$S/out/$name
    # shellcheck disable=SC2086 # the generator arguments are words without spaces
    if ! build/gen $args --mbs 2 --out "$out" > "$S/$name.gen.log" 2>&1 ||
       ! make -s --no-print-directory -f Makefile -f tests/regions/regions.mk \
            REGIONS_OUT="$out" REGIONS_BIN="$S/$name" "$S/$name" > "$S/$name.build.log" 2>&1
    then
        fail "$name" "generate/build failed: $(cat "$S/$name.gen.log" "$S/$name.build.log" |
                                               grep -m1 -E 'error|Error' | cut -c1-160)"
        continue
    fi
    RUN_TIMEOUT=120 run_prog "$S/$name" "$np" "$S/$name.log" "$name"
    rc=$?
    grep -E '^(PASS|FAIL) ' "$S/$name.log"
    if [ $rc != 0 ]; then
        FAILED=1
        grep -q '^FAIL ' "$S/$name.log" ||
            fail "$name" "exit $rc: $(grep -m1 -E 'rank|error' "$S/$name.log" | cut -c1-160)"
        grep '^\[rank' "$S/$name.log" | head -n 10 | sed 's/^/    /'
    elif [ "$(grep -c '^PASS ' "$S/$name.log")" -lt 15 ]; then
        fail "$name" "only $(grep -c '^PASS ' "$S/$name.log") of 15 tests reported"
    fi
done <<'EOF'
tiny-tp2 2 tiny --tp 2
tiny-tp2-sp 2 tiny --tp 2 --sp
tiny-tp4 4 tiny --tp 4
odd-tp5-sp 5 tests/models/odd.lua --tp 5 --sp
EOF
finish
