"""GPU: layer-streamed calibration (``oscarkv calibrate --stream-layers``) of a real model shape.

``python -m lab.benchmarks.stream_calibration OUT [SHAPE]`` writes a random-weight checkpoint of SHAPE
(default ``qwen3-8b``; bf16 safetensors, drawn on the GPU) with a byte-level BPE tokenizer trained on the
shipped calibration text (no download), then runs the real command on it in a fresh process and prints
its last lines: the time and the peak GPU memory (``torch.cuda.max_memory_allocated``), beside the
process's peak host RSS (``CHILD``) and the size of one decoder layer. Writes ``OUT/stream_calibration.json``.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from oscarkv.models.shapes import shape_config

TEXT = Path("oscarkv/data/calibration.txt")
CHILD = ("import sys\nfrom oscarkv.cli.main import main\ntry:\n    code = main(sys.argv[1:])\nfinally:\n"
         "    print(*(l for l in open('/proc/self/status') if l.startswith('VmHWM')), end='', flush=True)\nsys.exit(code)")
"""The command in a fresh process that prints its own peak RSS at exit (``VmHWM``: the high-water mark of this
process image; ``RUSAGE_CHILDREN``'s ``ru_maxrss`` would also count the parent's pages at the fork, here the
checkpoint writer's: 46.6 GiB on the first H100 run, 2026-11-27)."""


def tokenizer(text: str) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=4096, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def checkpoint(shape: str, path: Path) -> int:
    """Random bf16 weights of ``shape`` saved under ``path``; returns the bytes of one decoder layer."""
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(shape_config(shape), dtype=torch.bfloat16)
    layer = sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters())
    model.save_pretrained(path)
    del model
    torch.cuda.empty_cache()
    tokenizer(TEXT.read_text()).save_pretrained(path)
    return layer


def main(out: Path, shape: str = "qwen3-8b") -> None:
    t = time.perf_counter()
    layer = checkpoint(shape, out / "model")
    print(f"checkpoint written in {time.perf_counter() - t:.0f} s; one decoder layer {layer / 2**30:.2f} GiB", flush=True)
    args = ["calibrate", "--model", str(out / "model"), "--dtype", "bfloat16", "--stream-layers", "--out", str(out / "artifact")]
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True)
    wall = time.perf_counter() - t
    print(r.stdout[-3000:], r.stderr[-3000:] if r.returncode else "", flush=True)
    hwm = [int(line.split()[1]) / 2**20 for line in r.stdout.splitlines() if line.startswith("VmHWM:")]  # KiB -> GiB
    res = dict(shape=shape, device=torch.cuda.get_device_name(), command="oscarkv " + " ".join(args),
               returncode=r.returncode, wall_s=wall, peak_rss_gib=hwm[0] if hwm else None, layer_gib=layer / 2**30,
               last_line=[line for line in r.stdout.splitlines() if line.startswith("wrote")][-1:])
    (out / "stream_calibration.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:])
