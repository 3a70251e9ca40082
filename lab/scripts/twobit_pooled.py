"""Paired development scores of twobit_dev.py studies, pooled over their ``allocation_samples.jsonl`` logs.

Each log holds, per development sample, every configuration's answer NLL and accuracy; this prints each
configuration present in every log with its mean NLL, accuracy and paired difference (± standard error) against
each reference label (default ``int2``).

    python lab/scripts/twobit_pooled.py lab/results/dev_twobit_8k/allocation_samples.jsonl,\\
lab/results/dev_twobit_8k/eval_seeds_1004_1005/allocation_samples.jsonl int2 k4v2 bf16
"""

import json
import sys

from oscarkv.eval.paired import difference


def main() -> None:
    rows = [json.loads(line) for path in sys.argv[1].split(",") for line in open(path) if line.strip()]
    labels = [k for k in rows[0]["nll"] if all(k in r["nll"] for r in rows)]
    refs = sys.argv[2:] or ["int2"]
    print(f"{len(rows)} samples, seeds {sorted({r['seed'] for r in rows})}")
    for k in labels:
        nll = [r["nll"][k] for r in rows]
        line = f"{k:>32s}: NLL {sum(nll) / len(nll):.3f}, accuracy {sum(r['accuracy'][k] for r in rows) / len(rows):.0%}"
        for ref in refs:
            d, se = difference(nll, [r["nll"][ref] for r in rows])
            line += f" | vs {ref} {d:+.3f} ± {se:.3f}"
        print(line)


if __name__ == "__main__":
    main()
