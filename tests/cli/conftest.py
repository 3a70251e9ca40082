"""The command-line tests' model: the server tests' tiny byte-level Llama and its saved directory
(their ``model``, ``tok`` and ``model_dir`` fixtures), and their engine flags for it (``SMALL``)."""

from tests.server.conftest import SMALL, model, model_dir, tok  # noqa: F401 (fixtures, shared with the server tests)
