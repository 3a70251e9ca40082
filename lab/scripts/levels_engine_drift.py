"""How far the Triton engine (the kernels in the interpreter, on the CPU) drifts from the PyTorch oracle engine on
tests/engine's tiny bf16 model, per level kind: ``python lab/scripts/levels_engine_drift.py uniform lloyd_max`` prints,
per prompt, the first divergent token and the chosen-token log-prob differences up to it (the bound of
``tests/engine/test_levels.py::test_levels_triton_engine_matches_oracle_gpu`` comes from it)."""

import os
import sys
from dataclasses import replace

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

from oscarkv.attention.backends import TorchAttention, TritonAttention  # noqa: E402
from oscarkv.engine.engine import LLMEngine  # noqa: E402
from tests.engine.conftest import engine_config, make_artifact, prompts, run, tiny_model  # noqa: E402
from tests.engine.test_levels import TABLES  # noqa: E402

model = tiny_model().to(torch.bfloat16)
art = make_artifact(model.config)
art.tensors |= {"key.levels": torch.tensor(TABLES), "value.levels": torch.tensor(TABLES[::-1])}
ps = prompts(5, 61)
for levels in sys.argv[1:]:
    cfg = replace(engine_config(), kv=replace(engine_config().kv, levels=levels))
    kernels, oracle = (run(LLMEngine.from_hf(model, cfg, art, backend=b, cuda_graphs=False), ps)
                       for b in (TritonAttention(), TorchAttention()))
    for x, y in zip(kernels, oracle):
        n = next((i for i, (p, q) in enumerate(zip(x.token_ids, y.token_ids)) if p != q), len(x.token_ids) - 1)
        d = [round(abs(p - q), 3) for p, q in zip(x.logprobs[:n + 1], y.logprobs[:n + 1])]
        print(f"{levels} prompt {x.request_id}: first divergence at token {n}, max {max(d)}: {d}", flush=True)
