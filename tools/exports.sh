#!/bin/sh
# exports.sh HEADER...: the linker version script of the shared libraries on
# stdout: every function the public headers declare (a name tsr_NAME followed by
# "(" outside comments; the headers declare nothing else that way) global, every
# other symbol local. The Makefile makes it from PUBLIC_HEADERS at build time, so
# that a call declared in a public header is exported with no second list to
# keep, and an internal one (engine_*, s3_*, tsr_store_*) never is. A library
# that does not define a listed call (libtessera-core has no engine) leaves it out.
set -e
[ $# -gt 0 ] || { echo "exports.sh: no headers given" >&2; exit 1; }
for h in "$@"; do
    [ -r "$h" ] || { echo "exports.sh: $h: cannot read it" >&2; exit 1; }
done
# comments out (/* */ over lines, //), then each tsr_NAME( once
names=$(awk '
{
    line = $0; out = ""
    while (line != "") {
        if (incomment) {
            e = index(line, "*/")
            if (!e) { line = ""; break }
            line = substr(line, e + 2); incomment = 0
        } else {
            s = index(line, "/*"); c = index(line, "//")
            if (c && (!s || c < s)) { out = out substr(line, 1, c - 1); line = ""; break }
            if (!s) { out = out line; line = ""; break }
            out = out substr(line, 1, s - 1) " "; line = substr(line, s + 2); incomment = 1
        }
    }
    print out
}' "$@" | grep -o 'tsr_[A-Za-z0-9_]*[[:space:]]*(' | sed 's/[[:space:](]*$//' | sort -u)
[ -n "$names" ] || { echo "exports.sh: $*: no function declared" >&2; exit 1; }
echo "/* the calls of the public headers (made by tools/exports.sh: do not edit) */"
echo "{"
echo "  global:"
for n in $names; do echo "    $n;"; done
echo "  local: *;"
echo "};"
