#!/bin/sh
# test_layers.sh: tools/check_layers.sh passes on the tree and fails, naming the
# file and the rule, on a copy of the tree with one rule broken at a time: an
# upward include, kernels/ reaching past base/, a header name in two folders, an
# include cycle, a long function, a long file.
. "$TSR_ROOT/tests/common.sh"
R=$TSR_ROOT
CHECK=$R/tools/check_layers.sh

expect 0 "the tree keeps the layer rule" sh "$CHECK" "$R"
grep -q "none upward, no cycle" out.txt || fail "no summary line: $(cat out.txt)"

fresh() { # a copy of the tree's sources in ./tree
    rm -rf tree && mkdir tree
    for d in base kernels formats reshard comm ckpt train convert tools include tests; do
        [ -d "$R/$d" ] || continue
        mkdir -p "tree/$d" && cp "$R/$d"/*.[ch] "tree/$d/" 2>/dev/null
    done
}
broken() { # description, expected text in the output
    expect 1 "$1" sh "$CHECK" "$PWD/tree"
    grep -q "$2" out.txt || fail "$1: no line with '$2' in: $(cat out.txt)"
}

fresh; echo '#include "tsr_ckpt.h"' >> tree/formats/codec.c
broken "formats/ including ckpt/" 'formats/codec.c:.*ckpt/ is above formats/'

fresh; echo '#include "manifest.h"' >> tree/kernels/casts.c
broken "kernels/ including formats/" 'kernels/casts.c:.*formats/ is above kernels/'

fresh; cp tree/base/pool.h tree/ckpt/pool.h
broken "a header name in two folders" 'pool.h: header name also used by'

fresh; printf '#include "cycle_b.h"\n' > tree/ckpt/cycle_a.h; printf '#include "cycle_a.h"\n' > tree/ckpt/cycle_b.h
broken "an include cycle" 'cycle_a.h: its includes lead back to it'

fresh; { echo 'int too_long(int x) {'; i=0; while [ $i -lt 121 ]; do echo '    x++;'; i=$((i + 1)); done
         echo '    return x;'; echo '}'; } >> tree/base/box.c
broken "a function over 120 lines" 'function too_long has 124 lines'

fresh; i=0; while [ $i -lt 900 ]; do echo '/* padding */'; i=$((i + 1)); done >> tree/reshard/plan.c
broken "a file over 900 lines" 'reshard/plan.c: [0-9]* lines (at most 900)'

finish "layers: the rule holds on the tree and each broken rule is named"
