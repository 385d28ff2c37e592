#!/usr/bin/env python3
"""Lists likely failed store-to-load forwards in a binary's hot paths.

Finds 16-byte loads (movdqa/movdqu/movups/movaps) of a stack slot that 8-byte stores wrote within
the 12 instructions before, in the same function: the load cannot be forwarded from two stores and
waits for them to reach the cache (GCC did this to the store's 128-bit key digest). A heuristic
over `objdump -d` output, not a proof; read the functions it names.

Usage: scripts/store_forward_stalls.py BINARY [FUNCTION_REGEX]
Prints, per function whose demangled name matches FUNCTION_REGEX (default: every function), the
number of such loads and their first addresses.
"""
import re
import subprocess
import sys


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    pattern = re.compile(sys.argv[2] if len(sys.argv) > 2 else ".")
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", sys.argv[1]],
                             capture_output=True, text=True, check=True).stdout
    function, stores, hits = None, [], {}
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            function, stores = header.group(1), []
            continue
        insn = re.match(r"\s+([0-9a-f]+):\s+(\S+)\s+(.*)$", line)
        if not insn or function is None:
            continue
        address, op, args = insn.groups()
        load = re.match(r"(-?0x[0-9a-f]+)\((%[re][bs]p)\),%xmm", args)
        if op in ("movdqa", "movdqu", "movups", "movaps") and load:
            offset = int(load.group(1), 16)
            if any(base == load.group(2) and offset <= at < offset + 16
                   for at, base in stores[-12:] if base):
                hits.setdefault(function, []).append(address)
        store = re.match(r"%r\w+,(-?0x[0-9a-f]+)\((%[re][bs]p)\)$", args)
        stores.append((int(store.group(1), 16), store.group(2)) if op == "mov" and store
                      else (None, None))
    for name, addresses in hits.items():
        if pattern.search(name):
            print(len(addresses), name[:160], addresses[:6])
    return 0


if __name__ == "__main__":
    sys.exit(main())
