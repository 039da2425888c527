"""What the standard `OTEL_*` variables ask of tracing, read once at start-up.

Off unless asked: the specification's default exporter is `otlp`, but a gateway that
starts sending spans to localhost:4318 because nobody said otherwise surprises an
operator, so tracing is on only when `OTEL_TRACES_EXPORTER` names an exporter or an OTLP
endpoint is set. `OTEL_SDK_DISABLED=true` turns it off whatever else is set. The
variables this module does not read (`OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`,
`OTEL_BSP_*`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_PROPAGATORS`) are read by the SDK itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Exporter = Literal["otlp", "console"]
EXPORTERS: tuple[Exporter, ...] = ("otlp", "console")
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
OTLP_PROTOCOL = "http/protobuf"  # the one the installed exporter speaks
DEFAULT_SERVICE_NAME = "bastion"
DEFAULT_SAMPLER = "parentbased_always_on"


class TracingConfigError(ValueError):
    """An `OTEL_*` variable with a value tracing cannot honour; the message names it."""


@dataclass(frozen=True, slots=True)
class TracingConfig:
    """Which exporters to send spans to, under which service name and sampler.
    `exporters` empty means tracing is off."""

    exporters: tuple[Exporter, ...] = ()
    service_name: str = DEFAULT_SERVICE_NAME
    sampler: str = DEFAULT_SAMPLER
    sampler_ratio: float = 1.0

    @property
    def enabled(self) -> bool:
        return bool(self.exporters)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TracingConfig:
        if _get(environ, "OTEL_SDK_DISABLED").lower() == "true":
            return cls()
        exporters = _exporters(environ)
        if not exporters:
            return cls()
        if "otlp" in exporters:
            protocol = _get(environ, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or _get(
                environ, "OTEL_EXPORTER_OTLP_PROTOCOL"
            )
            if protocol not in ("", OTLP_PROTOCOL):
                raise TracingConfigError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported: Bastion "
                    f"exports OTLP as {OTLP_PROTOCOL} (port 4318 on a collector)"
                )
        sampler = _get(environ, "OTEL_TRACES_SAMPLER").lower() or DEFAULT_SAMPLER
        if sampler not in SAMPLERS:
            raise TracingConfigError(
                f"OTEL_TRACES_SAMPLER={sampler!r} is not one of: {', '.join(SAMPLERS)}"
            )
        return cls(
            exporters=exporters,
            service_name=_get(environ, "OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME,
            sampler=sampler,
            sampler_ratio=_ratio(environ, sampler),
        )


def _get(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


def _exporters(environ: Mapping[str, str]) -> tuple[Exporter, ...]:
    named = [n.strip().lower() for n in _get(environ, "OTEL_TRACES_EXPORTER").split(",")]
    named = [n for n in named if n]
    if not named:
        endpoint = _get(environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or _get(
            environ, "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ("otlp",) if endpoint else ()
    unknown = [n for n in named if n != "none" and n not in EXPORTERS]
    if unknown:
        raise TracingConfigError(
            f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}; Bastion knows "
            f"{', '.join(EXPORTERS)} and none"
        )
    return tuple(dict.fromkeys(n for n in named if n in EXPORTERS))


def _ratio(environ: Mapping[str, str], sampler: str) -> float:
    """The sampled fraction of `traceidratio` samplers (OTEL_TRACES_SAMPLER_ARG, 0 to 1)."""
    text = _get(environ, "OTEL_TRACES_SAMPLER_ARG")
    if not sampler.endswith("traceidratio") or not text:
        return 1.0
    try:
        ratio = float(text)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG={text!r} is not a ratio from 0 to 1")
    return ratio
