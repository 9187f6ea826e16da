# common.sh: sourced by the shell tests. $T is the tessera binary; fail counts
# failures (the test ends with [ $fails = 0 ]); expect STATUS WHAT CMD... runs CMD
# with its output in out.txt / err.txt and checks its exit status.
T=${TESSERA:?TESSERA must name the tessera binary}
[ -x "$T" ] || { echo "FAIL: $T is not built" >&2; exit 1; }
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
expect() { # expected-status description command...
    want=$1; what=$2; shift 2
    "$@" >out.txt 2>err.txt
    got=$?
    [ "$got" = "$want" ] || { fail "$what: exit $got, expected $want"; sed 's/^/    /' err.txt >&2; }
}
