"""The one settings object (``ServerConfig``) and its entrances: CLI flags, config files, environment."""

from agentjet.settings.fields import SettingField, find_field, server_fields
from agentjet.settings.load import (
    SettingsError,
    deep_merge,
    load_server_config,
    options_values,
    read_config_file,
    validate,
    write_config_file,
)
from agentjet.settings.models import (
    LIVE_SECTIONS,
    AbsentPolicy,
    EngineKind,
    EngineSettings,
    LogSink,
    LoraSettings,
    LossSettings,
    ObserveSettings,
    SamplingDefaults,
    ServerConfig,
    TrackingSettings,
    TrainingSettings,
    validate_ratios,
)

__all__ = [
    "LIVE_SECTIONS",
    "AbsentPolicy",
    "EngineKind",
    "EngineSettings",
    "LogSink",
    "LoraSettings",
    "LossSettings",
    "ObserveSettings",
    "SamplingDefaults",
    "ServerConfig",
    "SettingField",
    "SettingsError",
    "TrackingSettings",
    "TrainingSettings",
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
