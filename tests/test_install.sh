#!/bin/sh
# test_install.sh: make install puts the command, libtessera.so (with its soname
# and links), the core libraries libtessera-core.so.0 and libtessera-core-s3.so.0,
# the static libraries, the headers, tessera.pc and the manual page under PREFIX;
# a program built with `pkg-config --cflags --libs tessera` against the installed
# shared library saves a checkpoint and reads it back; the installed command
# verifies it; the installed Python package reads it over the installed core;
# make uninstall leaves nothing behind.
. "$TSR_ROOT/tests/common.sh"
B=${TSR_BUILD:?TSR_BUILD must name the build folder}
P=$TSR_TMP/prefix
MAKE="make -C $TSR_ROOT --no-print-directory BUILD=$B PREFIX=$P"
# the variables the folder was built with, so that make install rebuilds nothing
[ -f "$B/make-vars" ] || { echo "FAIL: $B/make-vars is missing (the Makefile writes it)" >&2; exit 1; }
eval "set -- $(cat "$B/make-vars")"
unset MAKEFLAGS MFLAGS MAKELEVEL
expect 0 "make install" $MAKE "$@" install
grep -q "^cc \|^ar \|^clang " out.txt && fail "make install rebuilt $B: $(grep -c "^cc " out.txt) compilations"
for f in bin/tessera lib/libtessera.a lib/libtessera-train.a lib/libtessera.so lib/libtessera-core.so.0 \
    lib/libtessera-core-s3.so.0 lib/pkgconfig/tessera.pc \
    include/tessera/tessera.h include/tessera/tsr_ckpt.h share/man/man1/tessera.1; do
    [ -e "$P/$f" ] || fail "make install: $f is missing"
done
version=$("$P/bin/tessera" --version | awk 'NR == 1 { print $2 }')
soname=$(readelf -d "$P/lib/libtessera.so" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
[ "$soname" = "libtessera.so.${version%%.*}" ] || fail "soname '$soname', not libtessera.so.${version%%.*}"
[ "$(readlink "$P/lib/$soname")" = "libtessera.so.$version" ] || fail "$soname does not link to libtessera.so.$version"
for core in libtessera-core libtessera-core-s3; do
    so=$(readelf -d "$P/lib/$core.so.${version%%.*}" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
    [ "$so" = "$core.so.${version%%.*}" ] || fail "$core: soname '$so', not $core.so.${version%%.*}"
    [ "$(readlink "$P/lib/$so")" = "$core.so.$version" ] || fail "$so does not link to $core.so.$version"
done
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
[ "$(pkg-config --modversion tessera)" = "$version" ] || fail "pkg-config says version $(pkg-config --modversion tessera)"
cat >prog.c <<'CEOF'
#include <stdio.h>
#include <string.h>
#include <tessera.h>
int main(int argc, char **argv) {
    tsr_error e = {0};
    float w[6] = {1, 2, 3, 4, 5, 6}, r[6] = {0};
    tsr_tensor_decl d = {"w", "model", TSR_F32, 2, {2, 3}, {-1, 1, TSR_PP_ALL, -1}};
    tsr_state_box b = {0, {2, {0, 0}, {2, 3}}, w, TSR_MEM_HOST};
    tsr_state st = {&d, 1, &b, 1, NULL, 0, {1, 1, 1, 1, 0, 0}};
    tsr_engine_opts o = tsr_engine_opts_default();
    o.sync = 1;
    tsr_comm *self = tsr_comm_self();
    tsr_engine *eng = argc > 1 ? tsr_engine_new(argv[1], self, &o, &e) : NULL;
    if (!eng || tsr_engine_save(eng, 7, &st, &e)) return fprintf(stderr, "save: %s\n", e.msg), 1;
    tsr_engine_free(eng);
    tsr_comm_free(self);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/step-00000007", argv[1]);
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    if (!ck || tsr_ckpt_read(ck, 0, &b.box, r, &e)) return fprintf(stderr, "read: %s\n", e.msg), 1;
    tsr_ckpt_close(ck);
    printf("libtessera %s: read back %s\n", TSR_VERSION_STRING, memcmp(w, r, sizeof w) ? "different" : "equal");
    return memcmp(w, r, sizeof w) != 0;
}
CEOF
# the library of a sanitizer build (make test's) needs the sanitizers' runtimes in the program too
san=""
nm -D "$P/lib/libtessera.so" | grep -q __asan_ && san="-fsanitize=address,undefined"
expect 0 "a program built with pkg-config" sh -c "cc $san \$(pkg-config --cflags tessera) prog.c \$(pkg-config --libs tessera) -o prog"
LD_LIBRARY_PATH="$P/lib" ldd ./prog | grep -q "libtessera.so.${version%%.*} => $P/lib/" ||
    fail "the program does not use the installed libtessera.so: $(LD_LIBRARY_PATH="$P/lib" ldd ./prog | grep tessera)"
expect 0 "the program" env LD_LIBRARY_PATH="$P/lib" ./prog "$TSR_TMP/ck"
grep -q "libtessera $version: read back equal" out.txt || fail "the program: $(cat out.txt)"
expect 0 "the installed command verifies what the program saved" "$P/bin/tessera" ckpt verify "$TSR_TMP/ck/step-00000007"
MANPAGER=cat man -l "$P/share/man/man1/tessera.1" >man.txt 2>&1 || fail "man cannot read tessera.1"
grep -q "tessera ckpt verify" man.txt && grep -q "usage: tessera reshard" man.txt ||
    fail "the manual page lacks the commands' help"
# the installed Python package finds the installed core library by itself
py=$(find "$P/lib" -path '*dist-packages/tessera/__init__.py' | head -n 1)
[ -n "$py" ] || fail "make install: no Python package under $P/lib"
pre=""
[ -n "$san" ] && pre="$(cc -print-file-name=libasan.so) $(cc -print-file-name=libubsan.so)"
expect 0 "the installed Python package" env -u TESSERA_LIB LD_PRELOAD="$pre" ASAN_OPTIONS=detect_leaks=0 \
    PYTHONPATH="$(dirname "$(dirname "$py")")" /usr/bin/python3 -c '
import sys, tessera
ck = tessera.open(sys.argv[1])
print(tessera.library()._name, ck.step, ck.read("w").tolist())' "$TSR_TMP/ck"
grep -q "^$P/lib/libtessera-core.so.0 7 \[\[1.0, 2.0, 3.0\], \[4.0, 5.0, 6.0\]\]" out.txt ||
    fail "the installed Python package: $(cat out.txt err.txt)"
expect 0 "make uninstall" $MAKE "$@" uninstall
left=$(find "$P" -type f -o -type l)
[ -z "$left" ] || fail "make uninstall left: $left"
finish "install: command, shared library $soname and the core, pkg-config, manual page; a program links and runs; uninstall clean"
