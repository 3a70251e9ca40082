"""``oscarkv bench engine`` (CPU tokens/s and bytes) serves OSCAR with the artifact's recipe, as ``LLM`` does."""

from oscarkv.bench.configs import EngineBench
from oscarkv.bench.engine import bench_one
from oscarkv.models.loader import LoadedModel
from tests.engine.conftest import make_artifact, tiny_model


def test_the_engine_bench_applies_the_artifacts_recipe():
    loaded = LoadedModel(tiny_model(), None, "tiny")  # token ids only
    art = make_artifact(loaded.config)
    spec = EngineBench(methods=("oscar",), batches=(1,), prompt_len=80, new_tokens=2)
    plain = bench_one(loaded, "oscar", 1, spec, art)
    art.manifest["recipe"] = {"sink": 16, "recent": 16, "page_size": 16}
    row = bench_one(loaded, "oscar", 1, spec, art)
    assert row["tiers_per_seq"] == [16, 48, 16] != plain["tiers_per_seq"]
    assert row["bpe_measured"] < plain["bpe_measured"]  # fewer BF16 tokens
