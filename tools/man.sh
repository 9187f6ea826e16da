#!/bin/sh
# man.sh TESSERA: the manual page tessera.1 (roff) on stdout, made from the
# command's own help: the list of commands, then each command's --help.
set -e
T=$1
version=$("$T" --version)
# roff: backslashes written as \e, a line that starts with . or ' guarded by \&
esc() { sed -e 's/\\/\\e/g' -e "s/^\([.']\)/\\\\\&\1/"; }
cat <<EOF
.TH TESSERA 1 "" "$version" "User Commands"
.SH NAME
tessera \- train Llama models and keep their checkpoints: save, reshard, export, archive
.SH SYNOPSIS
.B tessera
.I command
.RI [ options ]
.SH DESCRIPTION
tessera trains Llama-style models on CPUs and GPUs and writes asynchronous,
sharded, compressed checkpoints that it reshards between layouts, exports for
inference and archives to S3-compatible storage. The library behind it is
libtessera (\fBpkg-config --cflags --libs tessera\fR).
.SH COMMANDS
.nf
EOF
"$T" --help | sed '1,/^commands:/d' | esc
echo ".fi"
"$T" --help | sed '1,/^commands:/d' | awk '{ n = substr($0, 3, 15); sub(/ +$/, "", n); gsub(/ +/, " ", n); if (n != "") print n }' |
while read -r cmd; do
    echo ".SS \"tessera $cmd\""
    echo ".nf"
    # shellcheck disable=SC2086
    "$T" $cmd --help | esc
    echo ".fi"
done
cat <<EOF
.SH EXIT STATUS
0 on success, 2 for a usage error (a wrong flag or argument), 1 for any other error,
which is said on standard error with the file, tensor or request it concerns.
.SH SEE ALSO
The README and FORMAT.md (the checkpoint format) of the tessera sources.
EOF
