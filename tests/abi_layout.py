"""abi_layout.py ROOT DIR: the ctypes structures of the Python package
(ROOT/python/tessera/*.py) against the C structs they mirror. Every class of the
package derived from ctypes.Structure names its C struct (_c_name_); the struct's
fields are read from the public headers (ROOT/*/tsr_*.h), and a C program made
in DIR from them prints sizeof, _Alignof and, for every field, offsetof and
sizeof, compiled against the headers (cc) and run. The two sides must have the
same fields in the same order, at the same offsets and of the same sizes, and
the same size and alignment: a field added, removed or moved on one side only
fails, naming the struct and the field. Prints "FAIL: ..." for each difference
and exits 1 if there is any; else one line per struct checked."""
import ast
import ctypes
import glob
import importlib
import os
import re
import subprocess
import sys

root, work = sys.argv[1], sys.argv[2]
fails = []


def fail(msg):
    fails.append(msg)
    print("FAIL: " + msg)


def structures():
    """{class name: (file, class)} for every ctypes.Structure of the package: the
    classes are found in the source (ast), so that one the import would not
    reach is still checked, then taken from the imported module."""
    sys.path.insert(0, os.path.join(root, "python"))
    found = {}
    for path in sorted(glob.glob(os.path.join(root, "python", "tessera", "*.py"))):
        tree = ast.parse(open(path).read(), path)
        names = [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and
                 any("Structure" in ast.unparse(b) or "Union" in ast.unparse(b) for b in n.bases)]
        if not names:
            continue
        base = os.path.splitext(os.path.basename(path))[0]
        mod = importlib.import_module("tessera" if base == "__init__" else "tessera." + base)
        for name in names:
            cls = getattr(mod, name, None)
            if not (isinstance(cls, type) and issubclass(cls, (ctypes.Structure, ctypes.Union))):
                fail("%s: class %s is not a ctypes structure at the module's top level" % (path, name))
                continue
            found[name] = (path, cls)
    return found


def c_structs():
    """{struct name: [field names in order]} of the `typedef struct NAME {...}
    NAME;` of the public headers, comments left out."""
    out = {}
    for h in sorted(glob.glob(os.path.join(root, "*", "tsr_*.h"))):
        text = re.sub(r"/\*.*?\*/", " ", open(h).read(), flags=re.S)
        text = re.sub(r"//[^\n]*", " ", text)
        for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\{", text):
            depth, i = 1, m.end()
            while depth:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            body = text[m.end():i - 1]
            fields = []
            for decl in body.split(";"):
                decl = decl.strip()
                if not decl:
                    continue
                fp = re.search(r"\(\s*\*\s*(\w+)\s*\)\s*\(", decl)  # a function pointer
                if fp:
                    fields.append(fp.group(1))
                    continue
                for part in re.sub(r"\[[^\]]*\]", "", decl).split(","):
                    fields.append(re.findall(r"\w+", part)[-1])
            out[m.group(1)] = (h, fields)
    return out


py = structures()
cs = c_structs()
if not py:
    fail("no ctypes structure found in %s/python/tessera" % root)
checked = []
for name, (path, cls) in sorted(py.items()):
    c = getattr(cls, "_c_name_", None)
    if not c:
        fail("%s: %s names no C struct (_c_name_ = \"tsr_...\")" % (path, name))
    elif c not in cs:
        fail("%s: %s mirrors %s, which no public header defines as typedef struct %s {...} %s" % (path, name, c, c, c))
    else:
        checked.append((name, path, cls, c))

# the C side: one program printing every struct's layout
prog = ["#include <stddef.h>", "#include <stdio.h>", '#include "tessera.h"', "int main(void) {"]
for _, _, _, c in checked:
    prog.append('    printf("%s %%zu %%zu\\n", sizeof(%s), _Alignof(%s));' % (c, c, c))
    for f in cs[c][1]:
        prog.append('    printf("%s.%s %%zu %%zu\\n", offsetof(%s, %s), sizeof(((%s *)0)->%s));' % (c, f, c, f, c, f))
prog += ["    return 0;", "}"]
src, exe = os.path.join(work, "abi_layout.c"), os.path.join(work, "abi_layout")
with open(src, "w") as f:
    f.write("\n".join(prog) + "\n")
incs = ["-I" + os.path.join(root, "include")] + ["-I" + os.path.dirname(h) for h in
                                                 sorted(glob.glob(os.path.join(root, "*", "tsr_*.h")))]
r = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror"] + incs + [src, "-o", exe], capture_output=True, text=True)
if r.returncode:
    fail("%s does not compile (a field the headers' parse got wrong?): %s" % (src, r.stderr.strip()))
    sys.exit(1)
layout = {}
for line in subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split("\n"):
    if line:
        k, a, b = line.split()
        layout[k] = (int(a), int(b))

for name, path, cls, c in checked:
    where = "%s: %s (%s, %s)" % (os.path.basename(path), name, c, os.path.relpath(cs[c][0], root))
    cf, pf = cs[c][1], [f[0] for f in cls._fields_]
    if cf != pf:
        only_c = [f for f in cf if f not in pf]
        only_py = [f for f in pf if f not in cf]
        fail("%s: fields differ: C %s, Python %s%s%s" % (where, cf, pf,
                                                          "; only in C: %s" % only_c if only_c else "",
                                                          "; only in Python: %s" % only_py if only_py else ""))
    size, align = layout[c]
    if (size, align) != (ctypes.sizeof(cls), ctypes.alignment(cls)):
        fail("%s: C size %d, alignment %d; Python size %d, alignment %d" % (where, size, align, ctypes.sizeof(cls),
                                                                          ctypes.alignment(cls)))
    for f in pf:
        if f not in cf:
            continue
        off, fsize = layout["%s.%s" % (c, f)]
        d = getattr(cls, f)
        if (off, fsize) != (d.offset, d.size):
            fail("%s: field %s at offset %d, %d bytes in C; at %d, %d bytes in Python" % (where, f, off, fsize,
                                                                                       d.offset, d.size))
    print("%s: %d fields, %d bytes" % (where, len(pf), ctypes.sizeof(cls)))
sys.exit(1 if fails else 0)
