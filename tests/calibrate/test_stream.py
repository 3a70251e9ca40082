"""Layer-streamed calibration (``CalibrationConfig.stream_layers``) against the whole-model path on tiny
random models: the same artifact bit for bit, one decoder layer's weights off ``meta`` at a time, the
model whole again afterwards, and a clear refusal of what it cannot run."""

import random
from dataclasses import replace

import pytest
import torch

from oscarkv.calibrate import calibrate
from oscarkv.calibrate.stats import StatsCollector
from oscarkv.calibrate.stream import stream_forward
from oscarkv.config import CalibrationConfig
from oscarkv.models.loader import LoadedModel
from tests.engine.conftest import D, HKV, tiny_model
from tests.models.test_architectures import IdTokenizer

CFG = CalibrationConfig(tokens=160, chunk=64, heldout_tokens=64)  # chunks of 64, 64, 32: longer than Gemma's window 12


def text() -> str:
    rng = random.Random(0)
    return "".join(rng.choice("abcdefghij klmnopqrstuvwxyz.") for _ in range(300))


def loaded(arch: str) -> LoadedModel:
    return LoadedModel(tiny_model(arch), IdTokenizer(), "tiny")


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM"])
def test_streamed_artifact_is_the_whole_model_artifact(arch):
    model = loaded(arch)
    before = {name: p.clone() for name, p in model.model.named_parameters()}
    want, want_rows = calibrate(model, CFG, [text()])
    got, got_rows = calibrate(model, replace(CFG, stream_layers=True), [text()])
    assert want.tensors.keys() == got.tensors.keys()
    for key, tensor in want.tensors.items():
        assert torch.equal(got.tensors[key], tensor), key
    for manifest in (want.manifest, got.manifest):
        manifest["calibration"].pop("seconds")
    assert got.manifest == want.manifest and got_rows == want_rows
    assert "stream_layers" not in got.manifest["options"]
    for name, p in model.model.named_parameters():  # the model is whole again, its weights untouched
        assert p.device == before[name].device and torch.equal(p, before[name]), name


def test_at_most_one_decoder_layer_is_on_the_compute_device():
    model = tiny_model("Qwen3ForCausalLM")
    layers, seen = model.model.layers, []

    def check(index):
        def hook(module, args, kwargs):
            resident = [i for i, layer in enumerate(layers) if any(p.device.type != "meta" for p in layer.parameters())]
            seen.append((index, resident))
        return hook

    handles = [layer.register_forward_pre_hook(check(i), with_kwargs=True) for i, layer in enumerate(layers)]
    ids = torch.randint(0, 128, (3, 40))
    stream_forward(model, list(ids[:, None]), StatsCollector(len(layers), HKV, D), "test")
    for h in handles:
        h.remove()
    assert seen == [(i, [i]) for i in range(len(layers)) for _ in range(3)]


def test_unsupported_architecture_is_refused_by_name():
    model = loaded("Qwen3MoeForCausalLM")
    with pytest.raises(ValueError, match="stream-layers does not support Qwen3MoeForCausalLM"):
        calibrate(model, replace(CFG, stream_layers=True), [text()])
