"""The one settings object (``ServerConfig``) and its entrances: CLI flags, config files, environment. The schema is
in files by role: ``generator.py``, ``learner.py``, ``placement.py``, ``training.py`` and ``server.py`` (the whole)."""

from agentjet.settings.fields import SettingField, find_field, server_fields
from agentjet.settings.generator import (
    EngineKind,
    EngineProcessSettings,
    FleetSettings,
    GeneratorSettings,
    SamplingDefaults,
    VLLMSettings,
)
from agentjet.settings.learner import LearnerGroupSettings, LearnerSettings, LoraSettings, LossSettings
from agentjet.settings.load import (
    SettingsError,
    deep_merge,
    load_server_config,
    options_values,
    read_config_file,
    validate,
    write_config_file,
)
from agentjet.settings.placement import PlacementSettings
from agentjet.settings.server import LogSink, ObserveSettings, ServerConfig, ToolParserKind
from agentjet.settings.training import AbsentPolicy, TrackingSettings, TrainingSettings, validate_ratios

__all__ = [
    "AbsentPolicy",
    "EngineKind",
    "EngineProcessSettings",
    "FleetSettings",
    "GeneratorSettings",
    "LearnerGroupSettings",
    "LearnerSettings",
    "LogSink",
    "LoraSettings",
    "LossSettings",
    "ObserveSettings",
    "PlacementSettings",
    "SamplingDefaults",
    "ServerConfig",
    "SettingField",
    "SettingsError",
    "ToolParserKind",
    "TrackingSettings",
    "TrainingSettings",
    "VLLMSettings",
    "deep_merge",
    "find_field",
    "load_server_config",
    "options_values",
    "read_config_file",
    "server_fields",
    "validate",
    "validate_ratios",
    "write_config_file",
]
