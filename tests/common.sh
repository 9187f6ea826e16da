# common.sh: sourced by the shell tests. $T is the tessera binary; fail counts
# failures; expect STATUS WHAT CMD... runs CMD with its output in out.txt /
# err.txt and checks its exit status; finish [MESSAGE] ends the test: exit 0
# (printing MESSAGE) when every check passed, else exit 1 with the count (never
# `exit $fails`: an exit status wraps at 256, and 77 reads as a skip).
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
finish() { # [success message]
    if [ "$fails" = 0 ]; then
        [ $# = 0 ] || echo "$*"
        exit 0
    fi
    echo "$fails check(s) failed" >&2
    exit 1
}
