"""guardrails."""

from guardrails.config import (
    InjectionConfig,
    InputGuardrailsConfig,
    OutputGuardrailsConfig,
    PiiConfig,
    Topic,
    TopicConfig,
)
from guardrails.injection import InjectionDetector
from guardrails.input_check import InputCheckResult, InputGuardrails
from guardrails.normalize import decoded_variants, normalize
from guardrails.pii import (
    PiiCheck,
    PiiFinding,
    PiiModelNotFoundError,
    PiiRedactor,
    RedactionResult,
    build_analyzer,
)
from guardrails.streaming import StreamingRedactor
from guardrails.tool_calls import (
    ParsedToolCall,
    ToolCallCheck,
    ToolSpec,
    extract_tool_calls,
    tool_prompt,
    validate_tool_calls,
)
from guardrails.topics import TopicMatcher
from guardrails.verdict import Action, CheckMode, Verdict

__all__ = [
    "Action",
    "CheckMode",
    "InjectionConfig",
    "InjectionDetector",
    "InputCheckResult",
    "InputGuardrails",
    "InputGuardrailsConfig",
    "OutputGuardrailsConfig",
    "ParsedToolCall",
    "PiiCheck",
    "PiiConfig",
    "PiiFinding",
    "PiiModelNotFoundError",
    "PiiRedactor",
    "RedactionResult",
    "StreamingRedactor",
    "ToolCallCheck",
    "ToolSpec",
    "Topic",
    "TopicConfig",
    "TopicMatcher",
    "Verdict",
    "build_analyzer",
    "decoded_variants",
    "extract_tool_calls",
    "normalize",
    "tool_prompt",
    "validate_tool_calls",
]
