"""Session 50: each traced round's lag verdicts, as NODE@CHUNKS and how (``p``: by the pace,
``L``: by the look), per version (``v1`` the first step).

    python docs/results/linerate/session50/verdicts.py DIR
"""

from __future__ import annotations

import glob
import json
import sys


def main(root: str) -> None:
    for d in sorted(glob.glob(f"{root}/**/round*", recursive=True)):
        if d.endswith("simulated"):
            continue
        out = []
        for path in sorted(glob.glob(f"{d}/r*.jsonl")):
            with open(path) as f:
                for line in f:
                    e = json.loads(line)
                    if e["ev"] == "lagging":
                        how = "p" if e.get("paced") else "L"
                        out.append(f"{e['node']}v{e['version']}@{e['held']}{how}")
        print(d, " ".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
