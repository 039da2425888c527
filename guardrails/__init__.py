"""guardrails."""

from guardrails.config import (
    CustomRecognizer,
    InjectionConfig,
    InputGuardrailsConfig,
    LeakConfig,
    OutputGuardrailsConfig,
    PiiAction,
    PiiConfig,
    SecretsConfig,
    Topic,
    TopicConfig,
)
from guardrails.injection import InjectionDetector
from guardrails.injection_classifier import ClassifierWeightsError, InjectionClassifier
from guardrails.input_check import InputCheckResult, InputGuardrails
from guardrails.leaks import LeakDetector, new_canary
from guardrails.normalize import decoded_variants, normalize
from guardrails.output_check import OutputCheckResult, OutputGuardrails
from guardrails.pii import (
    PiiCheck,
    PiiConfigError,
    PiiFinding,
    PiiModelNotFoundError,
    PiiRedactor,
    RedactionResult,
    build_analyzer,
    restore,
)
from guardrails.secrets import SecretsFilter
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
from guardrails.verdict import Action, CheckMode, Filtered, Verdict

__all__ = [
    "Action",
    "CheckMode",
    "ClassifierWeightsError",
    "CustomRecognizer",
    "Filtered",
    "InjectionClassifier",
    "InjectionConfig",
    "InjectionDetector",
    "InputCheckResult",
    "InputGuardrails",
    "InputGuardrailsConfig",
    "LeakConfig",
    "LeakDetector",
    "OutputCheckResult",
    "OutputGuardrails",
    "OutputGuardrailsConfig",
    "ParsedToolCall",
    "PiiAction",
    "PiiCheck",
    "PiiConfig",
    "PiiConfigError",
    "PiiFinding",
    "PiiModelNotFoundError",
    "PiiRedactor",
    "RedactionResult",
    "SecretsConfig",
    "SecretsFilter",
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
    "new_canary",
    "normalize",
    "restore",
    "tool_prompt",
    "validate_tool_calls",
]
