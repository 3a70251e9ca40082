"""The seam between the model and the paged cache: ``step`` (the per-step context a model layer
calls, and the backend interface) and ``backends`` (PyTorch and Triton implementations)."""
