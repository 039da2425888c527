"""Keeps Triton out of a process that has no CUDA device.

xgrammar depends on Triton for its GPU kernels, and torch._dynamo (which transformers
imports) loads Triton whenever it is installed: about 60 MiB resident and 0.1 s at start,
for a compiler that never runs on a CPU. Without a CUDA device, `import triton` fails here
as it would were Triton not installed, a case torch and transformers handle. Importing this
module does it: `engine` imports it first, and `bastion` (gateway/cli.py) imports `engine`
before anything that imports transformers."""

from __future__ import annotations

import sys

import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    # None in sys.modules makes `import triton` raise ImportError.
    sys.modules["triton"] = None  # type: ignore[assignment]
