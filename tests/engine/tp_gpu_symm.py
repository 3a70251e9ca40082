"""Run by ``test_tensor_parallel_gpu`` in a subprocess: one symmetric-memory all-reduce kind per process.

``python -m tests.engine.tp_gpu_symm KIND[@RANKS]``: the tensor-parallel scenario on two GPUs (or RANKS) with ``KIND``
(``one_shot``, ``two_shot`` or ``one_shot_norm``; decode messages through it inside the graphs, prefill chunks through NCCL)
must give tp = 1's tokens up to a near-tie. Then a second engine in the same process must be refused
with a clear error, not hang (``oscarkv.models.allreduce``: torch numbers its rendezvous per process).
Prints ``ok KIND`` on success. ``pieces``: the piecewise graphs at tp 2 under ``auto``'s kind.
"""

import sys

from tests.engine.test_gpu_engine import _compare_prefix
from tests.engine.test_tensor_parallel import scenario
from tests.engine.test_tensor_parallel_gpu import NEAR_TIE, _engines


def main(case: str) -> None:
    kind, _, tp = case.partition("@")  # KIND or KIND@RANKS
    one, two = _engines("oscar", kind, int(tp or 2))
    try:
        assert two.runner.tp.reduce.kind == kind
        if kind == "one_shot_norm":  # the sums fused into the norms (oscarkv.models.parallel.ReducingRMSNorm)
            assert two.runner.model.model.layers[1].mlp.down_proj.defer
        ref, counters = scenario(one)
        got, counters2 = scenario(two)
        assert got.keys() == ref.keys() and counters2 == counters
        _compare_prefix([got[k] for k in ref if got[k].token_ids], [ref[k] for k in ref if ref[k].token_ids], NEAR_TIE)
        assert two.runner.graphs.graphs, "decode steps were meant to replay CUDA graphs"
    finally:
        two.close()
    try:
        _engines("oscar", kind)
    except RuntimeError as e:
        assert "its own process" in str(e), e
    else:
        raise AssertionError("a second symmetric-memory engine in one process was not refused")
    print(f"ok {case}", flush=True)


def pieces() -> None:
    """``test_tp2_pieces_equal_tp1_gpu`` (OSCAR) with ``auto``'s kind of two GPUs in the pieces."""
    from tests.engine.test_tensor_parallel_gpu import test_tp2_pieces_equal_tp1_gpu

    test_tp2_pieces_equal_tp1_gpu("oscar", "auto")
    print("ok pieces", flush=True)


if __name__ == "__main__":
    pieces() if sys.argv[1] == "pieces" else main(sys.argv[1])
