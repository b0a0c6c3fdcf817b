#!/bin/bash
# tests/plot/suite.sh: tools/plot, the SVG picture of training logs. Every point of every line
# is read back through the axes the picture states (its <desc>) and must give the log's value;
# gaps (null), the validation loss, several runs, chosen panels; bad input refused with its
# message, and an earlier picture left whole. Under a second.
. "$(dirname "$0")/../lib.sh" plot
P=build/tools/plot
if ! make -s --no-print-directory $P > "$S/make.log" 2>&1; then
    fail build "make $P: $(first_error "$S/make.log")"
    finish
fi

# Two runs: a's loss is null at step 7 (a skipped step), validation losses at 10 and 20; b has
# its own numbers and no validation.
awk 'BEGIN {
    for (s = 1; s <= 20; s++) {
        loss = (s == 7) ? "null" : sprintf("%.6g", 5 - 0.1 * s + 0.03 * (s % 3))
        ev = (s % 10 == 0) ? sprintf(",\"eval_loss\":%.6g", 4.9 - 0.05 * s) : ""
        printf "{\"step\":%d,\"loss\":%s%s,\"lr\":%.6g,\"grad_norm\":%.6g,\"tok_s\":%.1f}\n",
               s, loss, ev, 6e-4 * s / 20, 1 + 1 / s, 1000 + 10 * s
    }
}' > "$S/a.jsonl"
awk 'BEGIN {
    for (s = 1; s <= 12; s++)
        printf "{\"step\":%d,\"loss\":%.6g,\"lr\":%.6g,\"grad_norm\":%.6g,\"tok_s\":%.1f}\n",
               s, 6 - 0.2 * s, 3e-4, 2 - 0.05 * s, 900 + 5 * s
}' > "$S/b.jsonl"

# check.py SVG LOG... : every panel's lines, read back through its <desc>, are the logs' numbers
cat > "$S/check.py" << 'PY'
import json, sys, xml.etree.ElementTree as ET
ns = {"s": "http://www.w3.org/2000/svg"}
svg, logs, want_keys = sys.argv[1], sys.argv[2:-1], sys.argv[-1].split(",")
root = ET.parse(svg).getroot()
panels = root.findall("s:g[@class='panel']", ns)
keys = [p.get("data-key") for p in panels]
assert keys == want_keys, f"panels {keys}, expected {want_keys}"
colours = [g.find("s:line", ns).get("stroke") for g in root.findall("s:g[@class='legend']", ns)]
assert len(colours) == len(logs), f"{len(colours)} legend entries for {len(logs)} runs"
runs = [[json.loads(l) for l in open(f) if l.strip()] for f in logs]
for p, key in zip(panels, keys):
    d = p.find("s:desc", ns).text.split()
    xlo, xhi, ylo, yhi = map(float, (d[1], d[2], d[4], d[5]))
    ax0, ay0, ax1, ay1 = map(float, d[7:11])
    for cls, k in (("main", key), ("extra", "eval_loss" if key == "loss" else None)):
        for r, (rows, colour) in enumerate(zip(runs, colours)):
            # the expected lines: runs of consecutive non-null values
            lines, cur = [], []
            for row in rows:
                if k is None or k not in row: continue
                if row[k] is None:
                    if cur: lines.append(cur); cur = []
                else: cur.append((row["step"], row[k]))
            if cur: lines.append(cur)
            got = [pl for pl in p.findall(f"s:polyline[@class='{cls}']", ns)
                   if pl.get("stroke") == colour]
            if cls == "extra" and lines:      # the validation loss: its points one line
                lines = [[pt for ln in lines for pt in ln]]
            assert len(got) == len(lines), f"{key}/{cls} run {r}: {len(got)} lines, {len(lines)} expected"
            for pl, ln in zip(got, lines):
                pts = [tuple(map(float, q.split(","))) for q in pl.get("points").split()]
                assert len(pts) == len(ln), f"{key} run {r}: {len(pts)} points, {len(ln)} expected"
                for (px, py), (x, y) in zip(pts, ln):
                    bx = xlo + (px - ax0) / (ax1 - ax0) * (xhi - xlo)
                    by = ylo + (ay1 - py) / (ay1 - ay0) * (yhi - ylo)
                    # two decimals of a pixel: 0.005 px of the axis' span
                    assert abs(bx - x) <= 0.006 / (ax1 - ax0) * (xhi - xlo), (key, x, bx)
                    assert abs(by - y) <= 0.006 / (ay1 - ay0) * (yhi - ylo), (key, y, by)
print("ok")
PY

# pic NAME ARGS...: plot ARGS into $S/NAME.svg; check NAME LOGS KEYS: read it back
check() {
    local name=$1 keys=$2
    shift 2
    if ! $P -o "$S/$name.svg" "$@" > "$S/$name.log" 2>&1; then
        fail "$name" "plot failed: $(head -n 1 "$S/$name.log")"
    elif ! python3 "$S/check.py" "$S/$name.svg" "${@: -$NLOGS}" "$keys" > "$S/$name.check" 2>&1
    then
        fail "$name" "$(tail -n 1 "$S/$name.check")"
    else
        pass "$name"
    fi
}
NLOGS=2 check two-runs loss,lr,grad_norm,tok_s "$S/a.jsonl" "$S/b.jsonl"
NLOGS=1 check panels tok_s,loss,grad_norm --panels tok_s,loss,grad_norm "$S/a.jsonl"
# a log written by the training program itself (tests/train leaves none here: make one line)
printf '%s\n' '{"step":1,"loss":5.5,"lr":0.0006,"grad_norm":5.7,"ms":570.7,"comm_ms":0.001,"tok_s":112.1,"tflops":0.00032}' \
    > "$S/one.jsonl"
NLOGS=1 check one-step loss,lr,grad_norm,tok_s "$S/one.jsonl"

# a panel with no data says so; a key no log holds is refused
$P -o "$S/nodata.svg" --panels loss,mfu "$S/a.jsonl" > "$S/nodata.log" 2>&1 &&
    grep -q 'no "mfu" in these logs' "$S/nodata.svg" && pass panel-without-data ||
    fail panel-without-data "$(head -n 1 "$S/nodata.log")"

# errors: the message, status 1, and the earlier picture unchanged
cp "$S/two-runs.svg" "$S/keep.svg"
expect_err() {
    local name=$1 want=$2
    shift 2
    $P -o "$S/keep.svg" "$@" > /dev/null 2> "$S/err-$name.err"
    local rc=$?
    if [ $rc -ne 1 ]; then fail "err-$name" "exit status $rc, expected 1"
    elif [ "$(cat "$S/err-$name.err")" != "$want" ]; then
        fail "err-$name" "message: $(head -n 1 "$S/err-$name.err") (expected: $want)"
    elif ! cmp -s "$S/keep.svg" "$S/two-runs.svg" || [ -e "$S/keep.svg.tmp" ]; then
        fail "err-$name" "the earlier picture was changed or a temporary file was left"
    else pass "err-$name"; fi
}
printf '{"step":1,"loss":5}\n{"step":2,"loss":\n' > "$S/bad.jsonl"
printf '{"loss":5}\n' > "$S/nostep.jsonl"
printf '{"step":1,"loss":"high"}\n' > "$S/str.jsonl"
expect_err missing "plot: error: cannot open $S/none.jsonl: No such file or directory" "$S/none.jsonl"
expect_err bad-json "plot: error: $S/bad.jsonl:2: not JSON: unexpected token near end of file (a log written by train --log holds one object a line)" "$S/bad.jsonl"
expect_err no-step "plot: error: $S/nostep.jsonl:1: no \"step\" number" "$S/nostep.jsonl"
expect_err not-number "plot: error: $S/str.jsonl:1: \"loss\" is not a number" "$S/str.jsonl"
expect_err no-key "plot: error: none of the panels' keys (--panels) is in the logs" --panels mfu "$S/a.jsonl"
: > "$S/empty.jsonl"
expect_err empty "plot: error: $S/empty.jsonl: no log lines" "$S/empty.jsonl"
$P -o /nonexistent/p.svg "$S/a.jsonl" > /dev/null 2> "$S/err-unwritable.err"
if [ $? -eq 1 ] && grep -qx "plot: error: cannot write /nonexistent/p.svg.tmp: No such file or directory" \
        "$S/err-unwritable.err"; then pass err-unwritable
else fail err-unwritable "$(head -n 1 "$S/err-unwritable.err")"; fi
finish
