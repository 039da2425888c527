"""The direct GGUF loader (engine/gguf_file.py, engine/gguf_model.py) against gguf-py's
reader and transformers' own GGUF loader, and the engine it serves against the engine on
transformers' weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType

from engine import EngineConfig, PagedEngine, SamplingParams, default_model_source, model_source
from engine.gguf_file import GGUFFile, GGUFFormatError
from engine.gguf_model import UnsupportedGGUF, hf_name, is_direct, load_gguf_model
from tests.engine.conftest import token_ids

PROMPTS = ([1, 9690, 314, 253, 1345, 28, 4134, 198], [504, 3458, 282, 4944, 314, 216])


def write_gguf(path: Path, architecture: str = "llama") -> np.ndarray:
    """A small GGUF with each kind of metadata and three tensor types; the float values."""
    values = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_uint32(f"{architecture}.block_count", 1)
    writer.add_string("general.name", "tiny é")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bé", "<c>", ""])
    writer.add_array("tokenizer.ggml.token_type", [1, 1, 3, 1])
    writer.add_array("general.languages", ["en"])
    writer.add_float32("x.eps", 1e-5)
    writer.add_bool("x.flag", True)
    writer.add_int64("x.big", -(2**40))
    for kind in (GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0):
        writer.add_tensor(f"t.{kind.name}", gguf.quants.quantize(values, kind), raw_dtype=kind)
    writer.add_tensor("t.F32", values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return values


def test_reader_reads_what_gguf_py_reads(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    values = write_gguf(path)
    ours = GGUFFile.open(path)
    reference = gguf.GGUFReader(path)
    assert ours.metadata == {
        "general.architecture": "llama",
        "llama.block_count": 1,
        "general.name": "tiny é",
        "tokenizer.ggml.tokens": ["a", "bé", "<c>", ""],
        "tokenizer.ggml.token_type": [1, 1, 3, 1],
        "general.languages": ["en"],
        "x.eps": float(np.float32(1e-5)),
        "x.flag": True,
        "x.big": -(2**40),
    }
    assert [t.name for t in reference.tensors] == list(ours.tensors)
    for tensor in reference.tensors:
        mine = ours.tensors[tensor.name]
        assert mine.kind == tensor.tensor_type
        assert np.array_equal(mine.raw, tensor.data)
        dequantized = np.array(gguf.dequantize(tensor.data, tensor.tensor_type)).reshape(
            values.shape
        )
        assert np.array_equal(mine.to_numpy(), dequantized)
        # torch's dequantization (Q4_1, Q8_0) rounds as gguf-py's does: bit for bit.
        assert torch.equal(mine.to_tensor(), torch.from_numpy(dequantized)), tensor.name
        assert mine.to_numpy().shape == values.shape
    assert np.array_equal(ours.tensors["t.F32"].to_numpy(), values)


def test_reader_refuses_other_files(tmp_path: Path) -> None:
    path = tmp_path / "not.gguf"
    path.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(GGUFFormatError, match="not a GGUF file"):
        GGUFFile.open(path)


def test_other_architectures_go_through_transformers(tmp_path: Path) -> None:
    path = tmp_path / "phi.gguf"
    write_gguf(path, architecture="phi3")
    assert not is_direct(GGUFFile.open(path))
    write_gguf(path, architecture="llama")
    assert is_direct(GGUFFile.open(path))


@pytest.fixture(scope="module")
def direct_smollm2() -> tuple[Any, Any]:
    source = default_model_source()
    assert source.gguf_file is not None
    return load_gguf_model(GGUFFile.open(source.folder / source.gguf_file), torch.float32)


def test_smollm2_weights_equal_transformers_loader(
    direct_smollm2: tuple[Any, Any], smollm2: tuple[Any, Any]
) -> None:
    direct, _ = direct_smollm2
    reference, _ = smollm2
    ours, theirs = direct.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype, name
        assert torch.equal(ours[name], tensor), name
    # Tied embedding: one tensor, as transformers leaves it.
    assert direct.lm_head.weight.data_ptr() == direct.model.embed_tokens.weight.data_ptr()
    assert type(direct.config) is type(reference.config)
    ignored = {"dtype", "_name_or_path"}
    assert {k: v for k, v in direct.config.to_dict().items() if k not in ignored} == {
        k: v for k, v in reference.config.to_dict().items() if k not in ignored
    }
    assert direct.generation_config.to_dict() == reference.generation_config.to_dict()


def test_smollm2_tokenizer_equals_transformers_loader(
    direct_smollm2: tuple[Any, Any], smollm2: tuple[Any, Any]
) -> None:
    _, ours = direct_smollm2
    _, theirs = smollm2
    assert type(ours) is type(theirs)
    assert ours.backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()
    assert ours.special_tokens_map == theirs.special_tokens_map
    assert ours.get_added_vocab() == theirs.get_added_vocab()
    assert ours.chat_template == theirs.chat_template
    assert (ours.add_bos_token, ours.padding_side) == (theirs.add_bos_token, theirs.padding_side)
    for text in ("Hello world", "  spaces\n\n\ttabs", "émoji 🎉 <|im_start|>user\nhi<|im_end|>"):
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], text
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert ours.apply_chat_template(messages, add_generation_prompt=True) == (
        theirs.apply_chat_template(messages, add_generation_prompt=True)
    )


def test_served_smollm2_answers_as_on_transformers_weights(smollm2: tuple[Any, Any]) -> None:
    """`PagedEngine.load` (the direct loader) and the engine on transformers' model give the
    same greedy tokens, in the format the gateway serves (`auto`)."""
    source = default_model_source()
    model, tokenizer = smollm2
    config = EngineConfig(weights="auto", kv_cache_mb=32, num_threads=1)
    loaded = PagedEngine.load(source, device="cpu", config=config)
    reference = PagedEngine.from_hf_model(model, tokenizer, source.model_id, "cpu", config=config)
    try:
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        ours = [token_ids(outs) for outs in loaded.generate(PROMPTS, params)]
        theirs = [token_ids(outs) for outs in reference.generate(PROMPTS, params)]
        assert ours == theirs
        assert [len(ids) for ids in ours] == [16, 16]
    finally:
        loaded.close()
        reference.close()


def test_load_model_reads_gguf_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's loader takes the direct path for SmolLM2: neither transformers' GGUF
    loaders nor gguf-py's reader (seconds per parse) run."""

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a slow GGUF loader was called")

    monkeypatch.setattr(model_source, "load_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    model, tokenizer = model_source.load_model(default_model_source(), torch.float32)
    assert model.config.model_type == "llama" and tokenizer.vocab_size == 49152
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.float32


def test_tensor_names_map_to_transformers_parameters() -> None:
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("blk.7.attn_q.bias") == "model.layers.7.self_attn.q_proj.bias"
    assert hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert hf_name("rope_freqs.weight") is None  # transformers computes them from the config
    with pytest.raises(UnsupportedGGUF, match=r"blk\.0\.ffn_gate_exps\.weight"):
        hf_name("blk.0.ffn_gate_exps.weight")  # a mixture of experts: transformers' loader
