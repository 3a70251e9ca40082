"""The command-line tests' model: the tiny byte-level Llama of the server tests and its saved directory
(the ``model``, ``tok`` and ``model_dir`` fixtures), and the engine flags for it (``SMALL``)."""

from tests.byte_llama import SMALL, model, model_dir, tok  # noqa: F401 (fixtures, shared with the server tests)
