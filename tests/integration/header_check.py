#!/usr/bin/env python3
"""Every public header compiles on its own: a translation unit that includes only that header
(twice, so a missing include guard shows too) must compile with the library's own flags,
warnings as errors. The flags come from the build's compile_commands.json (the entry of a
library source: a libtorch one when the build has libtorch, so include/starling/optim is
checked too), without the precompiled header, so nothing is included by accident.

Usage: header_check.py SOURCE_DIR BUILD_DIR"""
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import tempfile


def base_flags(build, src):
    entries = json.load(open(os.path.join(build, "compile_commands.json")))
    by_file = {os.path.normpath(e["file"]): e for e in entries}
    torch_src = os.path.normpath(os.path.join(src, "src/optim/optimizer.cpp"))
    plain_src = os.path.normpath(os.path.join(src, "src/net/host.cpp"))
    entry = by_file.get(torch_src) or by_file.get(plain_src)
    if entry is None:
        sys.exit("no compile command for src/optim/optimizer.cpp or src/net/host.cpp")
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-include"):
            skip = True
            continue
        if a in ("-c", "-MD", "-Winvalid-pch") or a == entry["file"]:
            continue
        out.append(a)
    return out, entry["directory"], entry is by_file.get(torch_src)


def main():
    src, build = sys.argv[1], sys.argv[2]
    flags, cwd, with_torch = base_flags(build, src)
    root = os.path.join(src, "include")
    headers = []
    for dp, _, files in os.walk(os.path.join(root, "starling")):
        for f in files:
            if f.endswith(".hpp"):
                rel = os.path.relpath(os.path.join(dp, f), root)
                if rel.startswith("starling/optim/") and not with_torch:
                    continue
                headers.append(rel)
    headers.sort()
    tmp = tempfile.mkdtemp(prefix="header-check-")

    def check(h):
        tu = os.path.join(tmp, h.replace("/", "_") + ".cpp")
        with open(tu, "w") as f:
            f.write(f'#include "{h}"\n#include "{h}"\n')
        p = subprocess.run(flags + ["-fsyntax-only", tu], cwd=cwd, capture_output=True, text=True)
        return h, p.returncode, p.stderr

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for h, rc, err in pool.map(check, headers):
            if rc != 0:
                failed += 1
                print(f"FAIL {h}\n{err[:3000]}")
    print(f"{len(headers) - failed}/{len(headers)} headers compile on their own"
          + ("" if with_torch else " (libtorch headers not checked: no libtorch in this build)"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
