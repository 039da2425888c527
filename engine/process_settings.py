"""What a serving process settles before torch loads: it is imported first by `engine`, and
`bastion` (gateway/cli.py) imports `engine` before anything that imports torch.

- **Triton stays out of a process that has no CUDA device.** xgrammar depends on Triton for
  its GPU kernels, and torch._dynamo (which transformers imports) loads Triton whenever it is
  installed: about 60 MiB resident and 0.1 s at start, for a compiler that never runs on a
  CPU. Without a CUDA device, `import triton` fails here as it would were Triton not
  installed, a case torch and transformers handle.
- **oneDNN keeps at most 64 matmul primitives.** Each prefill step's token count is a new
  matmul shape, and oneDNN caches a primitive (JIT code and buffers) per shape, up to 1,024
  by default: under the 64-client load they were 94% of the memory that kept growing for
  minutes (jemalloc's heap profile, docs/benchmarks.md). With 64 the load's memory stayed
  flat after its first minute, at no cost in throughput. An operator's own
  `ONEDNN_PRIMITIVE_CACHE_CAPACITY` wins.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")  # read at oneDNN's first use

import torch  # after the setting above

if "triton" not in sys.modules and not torch.cuda.is_available():
    # None in sys.modules makes `import triton` raise ImportError.
    sys.modules["triton"] = None  # type: ignore[assignment]
