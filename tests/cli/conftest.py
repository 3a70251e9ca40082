"""The command-line tests' model: the server tests' tiny byte-level Llama and its saved directory
(their ``model``, ``tok`` and ``model_dir`` fixtures), and engine flags small enough for it."""

from tests.server.conftest import model, model_dir, tok  # noqa: F401 (fixtures, shared with the server tests)

SMALL = ["--sink", "8", "--recent", "16", "--page-size", "8", "--prefill-chunk", "64",
         "--max-num-batched-tokens", "80", "--max-num-seqs", "4", "--kv-memory-bytes", str(1 << 22)]
