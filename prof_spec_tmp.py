import cProfile, pstats, time, torch
from tests.engine.conftest import engine_config, make_artifact, prompts, tiny_model
from oscarkv.config import SpeculativeConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
torch.set_num_threads(1)
model = tiny_model()
art = make_artifact(model.config)
spec = SpeculativeConfig("ngram", num_speculative_tokens=4, min_acceptance=0.0)
cfg = engine_config("oscar", speculative=spec, kv_memory_bytes=1 << 24, max_num_seqs=1, prefill_chunk=512,
                    max_num_batched_tokens=513)
engine = LLMEngine.from_hf(model, cfg, art)
doc = prompts(1, 600, seed=4)[0]
a = prompts(1, 10, seed=5)[0]
def go(i):
    engine.add_request(f"r{i}", doc + a * 4 + [i], SamplingParams(max_tokens=96, temperature=0, ignore_eos=True))
    n = 0
    while engine.has_unfinished():
        engine.step(); n += 1
    return n
go(0)
pr = cProfile.Profile(); t = time.perf_counter(); pr.enable(); steps = go(1); pr.disable()
print("steps", steps, "wall", time.perf_counter() - t, engine.spec.stats)
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(25)
print("=====")
st.sort_stats("cumtime").print_stats(r"oscarkv/(engine|cache|attention/step)", 30)
