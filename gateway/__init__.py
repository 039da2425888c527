"""gateway."""

import engine.cpu_imports  # noqa: F401  (keeps Triton out before transformers loads)
