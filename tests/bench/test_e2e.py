"""The end-to-end benchmarks' random OSCAR artifact: valid for the model it is drawn for, and it runs."""

from __future__ import annotations

import torch
from transformers import Qwen3Config

from oscarkv.bench import e2e
from oscarkv.engine.request import SamplingParams
from oscarkv.models.llama import PagedLM
from oscarkv.models.shapes import shape_config
from oscarkv.quant.artifact import ModelFingerprint


def test_random_artifact_at_a_real_shape():
    config = shape_config("qwen3-4b")
    art = e2e.random_artifact(config)
    art.validate(ModelFingerprint.from_config(config))
    assert art.manifest["group_size"] == 128 and set(art.tensors) >= {"key.scale", "value.scale"}
    assert art.tensors["value.mean"].abs().max() == 0 < art.tensors["key.mean"].abs().max()  # keys centered only


CONFIG = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=32, vocab_size=128, max_position_embeddings=512,
                     architectures=["Qwen3ForCausalLM"])


def test_oscar_engine_on_a_random_model_decodes():
    """``bench decode --methods oscar`` builds its engine this way (here on the CPU, tiny shape)."""
    engine = e2e.build_engine(PagedLM.random(CONFIG), "oscar", kv_bytes=1 << 22, max_num_seqs=1, chunk=64)
    assert engine.codec.quantized
    engine.add_request("r", torch.randint(0, 128, (400,)).tolist(), SamplingParams(max_tokens=4, temperature=0,
                                                                                  ignore_eos=True))
    out = None
    while engine.has_unfinished():
        out = engine.step() or out
    assert len(out[0].token_ids) == 4


def test_drive_fills_prompts_and_times_the_model_steps():
    """``e2e.drive`` (the job-throughput run): prompts filled through the write path, every sampled token
    from a model step (overlap on, as on a GPU), fill and model time apart; the runner fills only while it drives."""
    engine = e2e.build_engine(PagedLM.random(CONFIG), "naive", kv_bytes=1 << 22, max_num_seqs=2, chunk=64)
    engine.overlap = True
    runner = engine.runner
    e2e.add_prompts(engine, 3, 200, 5)  # 3 requests, 2 seats: two waves
    st = e2e.drive(engine)
    assert engine.runner is runner and not runner.filling
    assert not engine.has_unfinished() and engine.manager.bf16.num_used == 0
    assert sum(launch.filled for launch in runner.launches) == 3 * 4  # chunks ending at 64, 128, 192, 199 (then 200 samples)
    assert [launch.batch for launch in runner.launches if launch.batch] == st.batch_sizes
    assert engine.num_generated_tokens == 15 and engine.num_ahead_steps > 0
    # model launches: per wave its first tokens, then decode steps launched ahead or not
    assert st.steps == len(st.batch_sizes) == 10 and sorted(set(st.batch_sizes)) == [1, 2]
    assert st.fill_s > 0 and st.model_s > 0


def test_one_all_reduce_kind_for_every_row_of_a_run(caplog):
    """A bench run of several tensor-parallel engines in one process gives them all NCCL under ``auto``: only the
    first could hold a symmetric-memory buffer (one per process), and its rows would be compared with NCCL's. One
    engine, one GPU, or an explicit kind: unchanged."""
    assert e2e.one_kind("auto", 2, 1) == "auto" and e2e.one_kind("auto", 1, 4) == "auto"
    assert e2e.one_kind("one_shot_norm", 2, 3) == "one_shot_norm" and e2e.one_kind("nccl", 4, 2) == "nccl"
    with caplog.at_level("WARNING"):
        assert e2e.one_kind("auto", 2, 2) == "nccl"
    assert "one --methods value per run" in caplog.text
