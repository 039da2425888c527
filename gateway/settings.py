"""Configuration, read once from the environment (`BASTION_*`) and passed down."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.spec_drafts import LONGEST_DRAFT
from gateway.db.connection import SqliteSynchronous

REPO_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    """Every command (`serve`, `ingest`, `keys`, `db`) reads the same settings. Every
    `BASTION_*` variable is read here and nowhere else (the engine gets an `EngineConfig`)."""

    model_config = SettingsConfigDict(env_prefix="BASTION_", extra="ignore")

    data_dir: Path = Field(default=Path("data"), description="Database, indexes and keys.")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default: SQLite file in the data folder."
    )
    sqlite_synchronous: SqliteSynchronous = Field(
        default="normal",
        description="SQLite only: `normal` commits without an fsync (a commit survives a "
        "crash of Bastion; an operating-system crash or power cut can lose the last few); "
        "`full` fsyncs every commit, audit records included, for a few ms more an answer.",
    )
    redis_url: str | None = Field(
        default=None, description="Redis for rate limits shared by several processes."
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    policy_dir: Path = Field(
        default=REPO_ROOT / "policies", description="Folder of policy files (*.yaml)."
    )
    policy_reload_seconds: float = Field(
        default=2.0, ge=0, description="How often to look for edited policies; 0 disables."
    )
    heap_trim_seconds: float = Field(
        default=10.0,
        ge=0,
        description="How often to give the C heap's free pages back to the system (glibc's "
        "malloc_trim), so that memory stays flat under load; 0 disables.",
    )
    models_file: Path | None = Field(
        default=None,
        description="YAML of upstream models (vLLM, NIM, llama-server...) served besides "
        "the embedded one; hot-reloaded with the policies.",
    )
    model_path: Path | None = Field(
        default=None, description="A .gguf file or HF folder; default: SmolLM2-135M-Instruct."
    )
    device: str | None = Field(default=None, description="cpu or cuda; default: auto.")
    kv_cache_mb: int | None = Field(
        default=None, ge=16, description="KV cache budget in MiB; default: the engine's."
    )
    engine_weights: Literal["auto", "fp16", "w8a8", "int8", "float"] = Field(
        default="auto",
        description="int8: int8 weights (a scale per 64 features), decode steps in one native "
        "call where a C compiler is present, as faithful as fp16 and the fastest; "
        "fp16: fp16 weights for small batches, as faithful as bf16 (x86 CPUs); "
        "w8a8: int8 weights and activations (smoothed; fp16 in the most sensitive layers), "
        "slightly less faithful (docs/benchmarks.md); float: the model's own weights; "
        "auto: int8 on CPU where the native step builds (else fp16, or int8 without fbgemm), "
        "float on CUDA.",
    )
    engine_threads: int | None = Field(
        default=None,
        ge=1,
        description="Intra-op threads of the engine on CPU; default: every core. Fewer leave "
        "cores to other processes on a shared machine.",
    )
    engine_max_seqs: int | None = Field(
        default=None,
        ge=1,
        # Each decoding answer takes one token of the engine's per-step budget (512).
        le=512,
        description="The most answers the engine decodes at once (the rest wait in its "
        "queue); default: the engine's (64). More shortens the wait for a first token and "
        "lengthens the gaps between tokens.",
    )
    speculative_tokens: int = Field(
        default=LONGEST_DRAFT,
        ge=0,
        description="Longest prompt-lookup draft the engine verifies in one step "
        "(speculative decoding, engine/speculative.py; it drafts only while at most two "
        "answers run, where verifying costs little more than a decode step: about 1.8x one "
        "stream on RAG answers in docs/benchmarks.md); 0 turns it off. Policies can turn "
        "it off per tenant (`model.speculative_decoding`).",
    )
    native_decode: bool = Field(
        default=True,
        description="Decode steps of int8 weights in one native call, built with the C "
        "compiler on first use; off: PyTorch only.",
    )
    native_cache_dir: Path | None = Field(
        default=None,
        description="Where the native decode library is built and cached, and where a "
        "GGUF's int8 weights are kept prepared between starts; default: "
        "$XDG_CACHE_HOME/bastion/native (~/.cache/bastion/native).",
    )
    audit_signing_key: SecretStr | None = Field(
        default=None,
        description="Signs audit checkpoints; set it on every replica and keep a copy with "
        "the checkpoints' verifier. Default: a key file made once in the data folder.",
    )
    drain_seconds: float = Field(
        default=50.0,
        ge=0,
        description="On SIGTERM, how long answers in flight may take to finish while new "
        "requests are refused with 503 and /readyz says 503; keep it below the pod's "
        "terminationGracePeriodSeconds (60 in deploy/).",
    )
    log_json: bool | None = Field(
        default=None,
        description="Log one JSON object a line (true) or readable key=value lines (false); "
        "default: JSON unless stdout and stderr are both a terminal.",
    )
    sample_corpus: Path | None = REPO_ROOT / "docs" / "sample-corpus"
    default_tenant: str = "default"
    default_collection: str = "docs"

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'bastion.db').resolve()}"

    @property
    def index_dir(self) -> Path:
        return self.data_dir / "indexes"

    @property
    def default_key_file(self) -> Path:
        return self.data_dir / "default-api-key.txt"
