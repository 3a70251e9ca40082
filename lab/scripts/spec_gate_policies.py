"""Draft-gate policies replayed over the texts of ``spec_gate_sim.py`` (issue 29, development only; lab code).

A: the engine's gate. shadowN: a gate closed by failed probes probes again, once its pause is over, only after N
consecutive correct one-token lookups on the tokens the host already has (free: no device work, no lost overlap).
D: pauses growing 4x up to 256 steps. Modelled time per token = (steps x 1.14 + overlap breaks x 2.0 ms) / tokens
(1.14 ms: BF16 plain decode on an H200; 2.0 ms: between the 1.4 and 3.4 ms per break the GPU runs imply).

    OMP_NUM_THREADS=1 python lab/scripts/spec_gate_policies.py     # after spec_gate_sim.py --out lab/results/spec_gate_sim
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spec_gate_sim import replay  # noqa: E402

from oscarkv.bench.speculative import task_prompts  # noqa: E402
from oscarkv.cli.flags import load  # noqa: E402
from oscarkv.engine import speculative as S  # noqa: E402


def shadow(self, seq, need: int) -> bool:
    """``drafts_next`` of policy shadowN."""
    gate = self._gate.get(seq)
    if gate is None:
        return True
    if gate.wait > 0:
        _shadow(self, seq, gate)
        return False
    if gate.pause == 1:
        return True
    return _shadow(self, seq, gate) >= need


def _shadow(self, seq, gate) -> int:
    """Consecutive correct one-token lookups up to the host's last token (the lookup made one step before)."""
    index = self._index.get(seq)
    if index is None:
        index = self._index[seq] = S.NgramIndex(self.cfg.prompt_lookup_min, self.cfg.prompt_lookup_max)
    L, at = len(seq.token_ids), getattr(gate, "pred_at", -1)
    run = getattr(gate, "run", 0)
    run = (run + 1 if gate.pred == seq.token_ids[-1] else 0) if at == L - 1 else (run if at == L else 0)
    if at != L:
        nxt = index.propose(seq.token_ids, 1)
        gate.pred, gate.pred_at = (nxt[0] if nxt else None), L
    gate.run = run
    return run


def grow4(self, drafted: int, accepted: int) -> None:
    """``DraftGate.update`` of policy D: pauses of 4, 16, 64, 256 steps."""
    self.rate = self.DECAY * self.rate + (1 - self.DECAY) * accepted / drafted
    if self.rate >= self.floor:
        self.pause = 1
        return
    self.pause = min(4 * self.pause, 256)
    self.wait, self.rate = self.pause, self.floor


def row(name: str, prompts: dict, texts: dict) -> dict:
    out = {"policy": name}
    for task, text in texts.items():
        for k in (4, 8):
            r = replay(prompts[task], text, k)
            out[f"{task} K={k}"] = dict(r, ms_per_token=round((r["steps"] * 1.14 + r["breaks"] * 2.0) / len(text), 3))
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    folder = Path("lab/results/spec_gate_sim")
    texts = {t: json.loads((folder / f"text_{t}.json").read_text()) for t in ("copy", "no-copy")}
    prompts = task_prompts(load("default", "float32", "cpu").tokenizer, 6144)
    rows, plain = [row("A: the engine's gate", prompts, texts)], S.SpeculativeDecoder.drafts_next
    for need in (1, 2, 3):
        S.SpeculativeDecoder.drafts_next = lambda self, seq, need=need: shadow(self, seq, need)
        rows.append(row(f"shadow{need}", prompts, texts))
    S.SpeculativeDecoder.drafts_next, S.DraftGate.update = plain, grow4
    rows.append(row("D: pauses x4 to 256", prompts, texts))
    (folder / "policies.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
