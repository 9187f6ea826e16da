#!/bin/sh
# check_calls.sh: no circle of calls between files. Reads the objects of BUILD
# (every layer's, kernels/cuda's and the command's) with nm: file A calls into
# file B when A uses a symbol that B defines. A circle (A calls into B, and B,
# through any chain of files, back into A) is reported with the files on it and
# exits 1: one file of each pair must not need the other (a callback, or the
# function moved to where both can call it). Run by `make tests` after the
# build: `sh tools/check_calls.sh BUILD`.
BUILD=${1:?usage: sh tools/check_calls.sh BUILD}
objs=""
for d in base kernels kernels/cuda formats reshard comm store ckpt train convert launch tools; do
    for o in "$BUILD/$d"/*.o; do [ -f "$o" ] && objs="$objs $o"; done
done
[ -n "$objs" ] || { echo "check_calls: no objects under $BUILD" >&2; exit 1; }
# shellcheck disable=SC2086
nm -A $objs | awk -v build="$BUILD/" '
{
    file = $1; sub(/:.*/, "", file); sub("^" build, "", file); sub(/\.o$/, "", file)
    if (!(file in id)) { id[file] = ++n; name[n] = file }
    f = id[file]
    if ($2 == "U") { use[f, $3] = 1; used[f] = used[f] " " $3 }
    else if (NF == 3 && $2 ~ /^[TDBRGSVW]$/ && !($3 in def)) def[$3] = f
}
END {
    edges = 0
    for (f = 1; f <= n; f++) {
        k = split(used[f], s, " ")
        for (i = 1; i <= k; i++)
            if ((s[i] in def) && def[s[i]] != f && !reach[f, def[s[i]]]) { reach[f, def[s[i]]] = 1; edges++ }
    }
    for (k = 1; k <= n; k++)          # the transitive closure (Warshall)
        for (i = 1; i <= n; i++)
            if (reach[i, k])
                for (j = 1; j <= n; j++)
                    if (reach[k, j]) reach[i, j] = 1
    bad = 0
    for (i = 1; i <= n; i++) {
        if (done[i] || !reach[i, i]) continue
        line = name[i]
        for (j = i + 1; j <= n; j++)
            if (reach[i, j] && reach[j, i]) { line = line ", " name[j]; done[j] = 1 }
        print "check_calls: a circle of calls between " line; bad++
    }
    if (bad) exit 1
    printf "check_calls: %d objects, %d file-to-file calls, no circle\n", n, edges
}'
