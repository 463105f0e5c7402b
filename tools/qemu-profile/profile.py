#!/usr/bin/env python3
"""Where a firmware's instructions go, from a QEMU execution log.

QEMU without TCG plugins can still log every translated block it runs:

    qemu-system-aarch64 ... -icount shift=0 -d in_asm,exec,nochain -D qemu.log

(`in_asm` gives each block's instructions, `exec` each execution, `nochain`
makes every execution show). This script multiplies each block's
instructions by its executions and attributes every instruction to its
source with `llvm-symbolizer` (inlined frames included), from the first
execution of `--start` (a function symbol) on, and prints three tables:
the real (outermost) functions, the innermost function of this workspace
(what was inlined where), and the source files; `--lines` adds a fourth,
the workspace's source lines. `--per N` divides every count by N (the
packets the window holds), so the tables read per packet.

Usage (the bench role of the Elba's build, see docs/results "Firmware on
its CPU"):

    cargo xtask bench --firmware
    qemu-system-aarch64 -M virt -cpu cortex-a72 -m 256M -nodefaults \\
        -display none -monitor none -icount shift=0 \\
        -semihosting-config enable=on,target=native -serial file:console.txt \\
        -kernel target/metaroce/firmware-bench/setting4.elf \\
        -fw_cfg name=opt/metaroce/config,string=role=bench \\
        -d in_asm,exec,nochain -D qemu.log
    tools/qemu-profile/profile.py --elf target/metaroce/firmware-bench/setting4.elf \\
        --log qemu.log --start metaroce_node_engine::poll --per 2256

The log is large (about 1.2 GB for the bench role); only the standard
library and `llvm-symbolizer` are needed.
"""

import argparse
import bisect
import collections
import json
import pathlib
import re
import subprocess
import sys

BLOCK_RUN = re.compile(r"\[[0-9a-f]+/([0-9a-f]+)/")
HASH = re.compile(r"::h[0-9a-f]{16}$")


def symbols(elf):
    """(address, name) of every code symbol, sorted by address."""
    out = subprocess.run(
        ["nm", "-n", "--demangle", elf], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            found.append((int(parts[0], 16), parts[2]))
    return found


def window(elf, start):
    """[first, end) addresses of the function named `start`."""
    table = symbols(elf)
    addresses = [a for a, _ in table]
    for i, (address, name) in enumerate(table):
        if name == start or name.startswith(start + "::h"):
            following = bisect.bisect_right(addresses, address)
            end = addresses[following] if following < len(addresses) else 1 << 64
            return address, end
    sys.exit(f"profile.py: no symbol {start!r} in {elf}")


def executed(log, first, end):
    """Instructions executed per address, from the first run of a block
    in [first, end) on."""
    blocks, runs = {}, collections.Counter()
    current, started = [], False
    with open(log, errors="replace") as f:
        for line in f:
            if line.startswith("IN:"):
                current = []
            elif line.startswith("0x"):
                current.append(int(line[2 : line.index(":")], 16))
            elif line.startswith("Trace"):
                match = BLOCK_RUN.search(line)
                if not match:
                    continue
                block = int(match.group(1), 16)
                if current:
                    blocks[block] = current
                    current = []
                started = started or first <= block < end
                if started:
                    runs[block] += 1
    counts = collections.Counter()
    for block, n in runs.items():
        for address in blocks.get(block, ()):
            counts[address] += n
    return counts


def attribute(elf, counts, workspace):
    """Counts by outermost function, innermost workspace function, file
    and line of this workspace (for code outside it, the line that called
    or inlined it)."""
    addresses = sorted(counts)
    out = subprocess.run(
        ["llvm-symbolizer", "--obj=" + elf, "--output-style=JSON", "--demangle"],
        input="\n".join(hex(a) for a in addresses),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    outer, inner, files, lines = (collections.Counter() for _ in range(4))
    for line in out.splitlines():
        record = json.loads(line)
        n = counts[int(record["Address"], 16)]
        frames = record.get("Symbol") or [{"FunctionName": "?", "FileName": "?"}]
        own = [f for f in frames if workspace in f["FileName"]]
        first = own[0] if own else frames[0]
        outer[HASH.sub("", frames[-1]["FunctionName"])] += n
        inner[HASH.sub("", first["FunctionName"])] += n
        files[first["FileName"].replace(workspace, "") if own else "(outside the workspace)"] += n
        if own:
            lines[f'{first["FileName"].replace(workspace, "")}:{first.get("Line", 0)}'] += n
        else:
            lines["(outside the workspace)"] += n
    return outer, inner, files, lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elf", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--start", required=True, help="count from this function's first run")
    p.add_argument("--per", type=float, default=1.0, help="divide counts by this")
    p.add_argument("--top", type=int, default=30)
    p.add_argument(
        "--workspace",
        default=str(pathlib.Path(__file__).resolve().parents[2]) + "/",
        help="source prefix of our crates (default: this checkout)",
    )
    p.add_argument("--lines", action="store_true", help="also a table of source lines")
    a = p.parse_args()
    first, end = window(a.elf, a.start)
    counts = executed(a.log, first, end)
    total = sum(counts.values())
    if total == 0:
        sys.exit("profile.py: the log holds no run of that function")
    print(f"instructions from the first run of {a.start}: {total} ({total / a.per:.0f} per unit)")
    titles = ["outermost functions", "innermost workspace functions", "source files"]
    if a.lines:
        titles.append("source lines")
    for title, table in zip(titles, attribute(a.elf, counts, a.workspace)):
        print(f"\n{title}")
        for name, n in table.most_common(a.top):
            print(f"{n / a.per:9.0f} {100 * n / total:5.1f}%  {name[:140]}")


if __name__ == "__main__":
    main()
