#!/bin/bash
# tests/layering/suite.sh: the training library's structure, read from its objects (nm,
# readelf) and includes, against what lib/lib.mk declares (LIB_LAYERS; docs/DESIGN.md §1):
#   modules   every object's undefined symbols that another library object defines go to its
#             own module or to a lower layer: no call up, none sideways, so no cycle
#   includes  every lib/*.c and *.h includes only its own module's headers, lower layers'
#             headers, gpt.h and the runtime's
#   comm      no library function issues a collective or p2p but the one it is named for: a
#             function calls rt_X (or its _start/_wait halves) only if its name contains X.
#             From build/lib/sections (-O0, a section per function: each call is where the
#             source has it; calls through pointers are not seen). ALLOW lists today's
#             exceptions; a new one fails, and so does an entry that no longer occurs.
# Prints PASS/FAIL layering/<name> (tests/lib.sh); scratch in build/test/layering. Seconds.
. "$(dirname "$0")/../lib.sh" layering
B=build/lib

# Functions that issue communication their names do not say: none. (Until the layer was
# generated, lib/model.c's and lib/moe.c's layers issued their collectives inside; now every
# collective of the step is a line of the generated stage source.) An exception would be listed
# here as "object:function rt_symbol", and a listed one that no longer occurs fails too.
ALLOW="
"
# The runtime's communication: collectives, p2p, and their asynchronous _start/_wait halves.
COMM='^rt_(allreduce|allgather|reduce_scatter|alltoallv?|barrier|broadcast|p2p|send|recv)'
COMM="$COMM(_start|_wait)?\$"

if ! make -s --no-print-directory build/libgpt_cpu.a lib-sections > "$S/make.log" 2>&1; then
    fail build "make build/libgpt_cpu.a lib-sections: $(first_error "$S/make.log")"
    finish
fi
LAYERS=$(make -s --no-print-directory lib-layers)

# MOD[file], LAYER[file] for every file of LIB_LAYERS (kernels: kernels_cpu); also $S/modules
declare -A MOD LAYER
layer=0
for l in $LAYERS; do
    layer=$((layer + 1))
    for m in ${l//,/ }; do
        for f in ${m//+/ }; do
            [ "$f" = kernels ] && f=kernels_cpu
            MOD[$f]=${m%%+*}
            LAYER[$f]=$layer
            echo "$f ${m%%+*} $layer"
        done
    done
done > "$S/modules"

# -- modules: who calls whom, by the symbol tables ---------------------------------------------
missing=""
while read -r f _ _; do
    [ -f "$B/$f.o" ] || missing="$missing $f.o"
done < "$S/modules"
for o in $(ar t build/libgpt_cpu.a); do
    [ -n "${MOD[${o%.o}]}" ] || missing="$missing $o(not in LIB_LAYERS)"
done
objs=$(awk -v b="$B" '{ printf "%s/%s.o ", b, $1 }' "$S/modules")
# shellcheck disable=SC2086 # objs: a list of files
nm -A --defined-only $objs 2> /dev/null |
    awk '$2 ~ /^[TDBRCV]$/ { n = split($1, p, "/"); sub(/\.o:.*/, "", p[n]); print $3, p[n] }' |
    sort > "$S/defined"
# shellcheck disable=SC2086
nm -A -u $objs 2> /dev/null |
    awk '{ n = split($1, p, "/"); sub(/\.o:.*/, "", p[n]); print $NF, p[n] }' |
    sort > "$S/undefined"
# "user definer symbol" for every use of another library object's symbol
join "$S/undefined" "$S/defined" | awk '{ print $2, $3, $1 }' | sort -u > "$S/uses"
awk 'NR == FNR { mod[$1] = $2; lay[$1] = $3; next }
     mod[$1] != mod[$2] { print mod[$1], mod[$2] > "'"$S/graph"'" }
     mod[$1] != mod[$2] && lay[$2] >= lay[$1] {
         printf "  %s.o (%s, layer %d) uses %s of %s.o (%s, layer %d)\n",
                $1, mod[$1], lay[$1], $3, $2, mod[$2], lay[$2] }' \
    "$S/modules" "$S/uses" > "$S/up.log"
touch "$S/graph"
if [ -n "$missing" ]; then
    fail modules "objects missing or not placed in lib/lib.mk LIB_LAYERS:$missing"
elif [ -s "$S/up.log" ]; then
    head -n 20 "$S/up.log"
    fail modules "$(wc -l < "$S/up.log") uses of a module of the same or a higher layer (above)"
elif ! sort -u "$S/graph" | tsort > /dev/null 2> "$S/tsort.log"; then
    fail modules "the module graph has a cycle: $(head -c 200 "$S/tsort.log")"
else
    pass modules
fi

# -- includes: the headers follow the layers -------------------------------------------------
: > "$S/inc.log"
while read -r f mod lay; do
    for src in "lib/$f.c" "lib/$f.h"; do
        [ -f "$src" ] || continue
        for h in $(sed -n 's/^#include "\([^"]*\)\.h".*/\1/p' "$src"); do
            case $h in
            gpt | rt | rt_launch) continue ;;             # everyone's interfaces
            ../tools/tokenizer)                           # the tokenizer library: generate's
                [ "$f" = generate_main ] && continue ;;  # entry point links it, nothing else
            kernels | kernel_rows) h=kernels_cpu ;;
            esac
            hmod=${MOD[$h]} hlay=${LAYER[$h]}
            if [ -z "$hmod" ]; then
                echo "  $src includes $h.h, which is no module's header" >> "$S/inc.log"
            elif [ "$hmod" != "$mod" ] && [ "$hlay" -ge "$lay" ]; then
                echo "  $src ($mod, layer $lay) includes $h.h ($hmod, layer $hlay)" >> "$S/inc.log"
            fi
        done
    done
done < "$S/modules"
if [ -s "$S/inc.log" ]; then
    head -n 20 "$S/inc.log"
    fail includes "$(wc -l < "$S/inc.log") includes of a header of the same or a higher layer"
else
    pass includes
fi

# -- comm: a function issues only the communication its name says -----------------------------
for f in "${!MOD[@]}"; do
    [ "$f" = kernels_cpu ] && continue
    readelf -rW "$B/sections/$f.o" 2> /dev/null |
        awk -v o="$f.o" -v comm="$COMM" '
            /^Relocation section/ { fn = $3; gsub(/\047/, "", fn)
                                    fn = fn ~ /^\.rela\.text\./ ? substr(fn, 12) : "" }
            fn != "" && $5 ~ comm { print o ":" fn, $5 }'
done | sort -u > "$S/calls"
awk '{ split($1, p, ":"); op = $2; sub(/^rt_/, "", op); sub(/_(start|wait)$/, "", op)
       if (index(p[2], op) == 0) print }' "$S/calls" > "$S/offenders"
echo "$ALLOW" | awk 'NF' | sort -u > "$S/allow"
new=$(comm -23 "$S/offenders" "$S/allow")
gone=$(comm -13 "$S/offenders" "$S/allow")
if [ ! -s "$S/calls" ]; then
    fail comm "no communication found in $B/sections/*.o (readelf missing?)"
elif [ -n "$new" ]; then
    echo "$new" | sed 's/^/  /'
    fail comm "$(echo "$new" | wc -l) function(s) issue communication their names do not say\
 (above): name the function after it, or give that call a function of its own"
elif [ -n "$gone" ]; then
    echo "$gone" | sed 's/^/  /'
    fail comm "$(echo "$gone" | wc -l) allowed exception(s) no longer occur (above): remove\
 them from ALLOW in tests/layering/suite.sh"
else
    pass comm
fi
finish
