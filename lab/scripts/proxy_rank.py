"""Rank correlation of the cheap held-out proxies with development retrieval, from the formats study.

``python lab/scripts/proxy_rank.py [lab/results/formats_study/README.md]`` reads the study's key table
(configurations at 2.2-3.0 bits per element on the default model, each with its held-out relative
attention-output error, attention KL and C_Q-weighted key error, and its development NIAH accuracy
and answer NLL on 16 samples of the calibration haystack) and prints Spearman's rho of each proxy,
and of the answer NLL, with development NIAH (signs so that 1 means "ranks like retrieval"). Rows
without NIAH or with another sample count (a fraction like 1/5) are left out.
"""

import re
import sys
from pathlib import Path

from oscarkv.eval.objective import spearman

COLUMNS = {"relative attention-output error": 2, "attention KL": 3, "C_Q-weighted key error": 4,
           "development answer NLL": 6}
"""Cells of a table row (0: the configuration, 1: bits per element) holding each objective (lower is better)."""
NIAH = 5


def rows(text: str) -> list[list[str]]:
    """The key table's rows with a development NIAH percentage (cells stripped of ``|`` and ``**``)."""
    out = []
    for line in text.splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and re.fullmatch(r"[\d.]+%", cells[NIAH]):
            out.append(cells)
    return out


def main(path: str = "lab/results/formats_study/README.md") -> None:
    data = rows(Path(path).read_text())
    niah = [float(r[NIAH].rstrip("%")) for r in data]
    print(f"{len(data)} configurations: " + "; ".join(r[0] for r in data))
    for name, col in COLUMNS.items():
        print(f"Spearman with development NIAH, {name}: {spearman([-float(r[col]) for r in data], niah):.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
