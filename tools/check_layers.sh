#!/bin/sh
# check_layers.sh: checks the rules of README's "Layout" over the source tree.
#  - Every folder is a layer and includes only from the layers below it (and
#    from itself): base < kernels < formats < reshard < comm < store < ckpt <
#    train < convert < launch < tools; kernels/ from base/ only; include/ (the
#    public umbrella header) and tests/ sit on top.
#  - Every quoted #include outside tests/ names a header of the tree, and a
#    header name belongs to one folder only.
#  - No source file outside tests/ has more than 900 lines, and no function
#    more than 120.
# Prints one line per broken rule and exits 1 if there is any; else a summary.
# Run from anywhere: `sh tools/check_layers.sh [ROOT]`.
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT" || exit 1
LAYERS="base kernels formats reshard comm store ckpt train convert launch tools include tests"
MAX_FILE=900
MAX_FUNC=120

files=""
for d in $LAYERS kernels/cuda; do  # kernels/cuda: the kernels' CUDA twins
    for f in "$d"/*.c "$d"/*.cu "$d"/*.h; do [ -f "$f" ] && files="$files $f"; done
done

# shellcheck disable=SC2086
awk -v layers="$LAYERS" -v max_file=$MAX_FILE -v max_func=$MAX_FUNC '
BEGIN {
    n = split(layers, L, " ")
    for (i = 1; i <= n; i++) rank[L[i]] = i
    rank["include"] = rank["tools"]  # the umbrella header gathers every layer
    rank["tests"] = n + 1
    bad = 0
}
function folder(path) { sub(/\/.*/, "", path); return path }
function base(path) { sub(/.*\//, "", path); return path }
FNR == 1 {
    if (NR > 1) end_file()
    file = FILENAME; lines = 0; fstart = 0; cand = ""; nfiles++
    d = folder(file)
    if (file ~ /\.h$/) {
        b = base(file)
        if (b in owner && owner[b] != file) {
            printf "%s: header name also used by %s\n", file, owner[b]; bad++
        }
        owner[b] = file
    }
}
{ lines++ }
/^#include "/ {
    inc = $2; gsub(/"/, "", inc)
    ninc++; inc_from[ninc] = file; inc_name[ninc] = inc; inc_line[ninc] = FNR
}
# Functions: a definition starts at a column-0 line that names a function and
# ends at the next "}" in column 0 (the style of the tree).
file !~ /^tests\// {
    if ($0 ~ /^[A-Za-z_]/ && $0 !~ /^(typedef|struct|enum|union|extern)[ {]/ && $0 !~ /=/) {
        cand = $0; cand_line = FNR
    } else if ($0 !~ /^[ \t]/ && $0 !~ /^\{/) cand = ""
    if (!fstart && cand != "" && cand ~ /\(/ && $0 ~ /\{[ \t]*$/ && $0 !~ /;/) {
        fstart = cand_line; fname = cand; cand = ""
    }
    if (fstart && $0 ~ /^\}/) {
        len = FNR - fstart + 1
        if (len > longest) { longest = len; longest_at = file ":" fstart }
        if (len > max_func) {
            name = fname; sub(/\(.*/, "", name); sub(/.*[ *]/, "", name)
            printf "%s:%d: function %s has %d lines (at most %d)\n", file, fstart, name, len, max_func
            bad++
        }
        fstart = 0
    }
}
function end_file() {
    if (file !~ /^tests\// && lines > max_file) {
        printf "%s: %d lines (at most %d)\n", file, lines, max_file; bad++
    }
    if (file !~ /^tests\// && lines > largest) { largest = lines; largest_at = file }
}
END {
    end_file()
    for (i = 1; i <= ninc; i++) {
        from = inc_from[i]; inc = inc_name[i]
        if (!(inc in owner)) {
            if (folder(from) == "tests") continue  # a test may build against outside headers
            printf "%s:%d: includes \"%s\", which is no header of the tree\n", from, inc_line[i], inc
            bad++; continue
        }
        to = owner[inc]
        if (rank[folder(to)] > rank[folder(from)] || (folder(from) == "kernels" && folder(to) != "kernels" && folder(to) != "base")) {
            printf "%s:%d: includes %s: %s/ is above %s/ (README, \"Layout\")\n", from, inc_line[i], to, folder(to), folder(from)
            bad++
        }
        edge[from, to] = 1; out[from] = out[from] " " to
    }
    # include cycles among files (a header that reaches itself again)
    for (f in out) if (cycle_from(f, f, 0)) { printf "%s: its includes lead back to it\n", f; bad++ }
    if (bad) { printf "check_layers: %d problem(s)\n", bad; exit 1 }
    printf "check_layers: %d files, %d includes, none upward, no cycle; largest file %s (%d lines), longest function at %s (%d lines)\n", nfiles, ninc, largest_at, largest, longest_at, longest
}
function cycle_from(start, f, depth,    k, m, T) {
    if (depth > 64) return 0
    m = split(out[f], T, " ")
    for (k = 1; k <= m; k++) {
        if (T[k] == start) return 1
        if (!((start, T[k]) in seen)) { seen[start, T[k]] = 1; if (cycle_from(start, T[k], depth + 1)) return 1 }
    }
    return 0
}
' $files
