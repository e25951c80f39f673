"""Configuration, one concern per module; everything public is importable from `vcloud.config`.

- workflow.py:    the workflow config (config/*.yaml): schema validation, defaults, read_yaml
- model_sets.py:  the model configs (config/models/*.yaml): frozen dataclasses per section
- coerce.py:      YAML mapping -> dataclass, with one-line errors naming the key
- stage_hash.py:  what each stage depends on (via vcloud.registry) and its hash
"""

from vcloud.config.coerce import coerce, from_dict
from vcloud.config.model_sets import (
    AutoencoderConfig,
    CFDTConfig,
    Curriculum,
    DataConfig,
    EvaluationConfig,
    ModelSetConfig,
    Optimisations,
    RefinerConfig,
    SelfTraining,
    Stage0Config,
    Stage1Config,
    Stage2Config,
    Stage3Config,
    TrainConfig,
    UncrtaintsProtocol,
    config_to_dict,
    load_model_config,
)
from vcloud.config.stage_hash import NOT_HASHED_TRAIN_KEYS, config_hash, stage_config_dict
from vcloud.config.workflow import fill_defaults, fill_missing, key_path, read_yaml, validate_config

__all__ = [
    "AutoencoderConfig",
    "CFDTConfig",
    "Curriculum",
    "DataConfig",
    "EvaluationConfig",
    "ModelSetConfig",
    "Optimisations",
    "RefinerConfig",
    "SelfTraining",
    "Stage0Config",
    "Stage1Config",
    "Stage2Config",
    "Stage3Config",
    "TrainConfig",
    "UncrtaintsProtocol",
    "NOT_HASHED_TRAIN_KEYS",
    "coerce",
    "config_hash",
    "config_to_dict",
    "fill_defaults",
    "fill_missing",
    "from_dict",
    "key_path",
    "load_model_config",
    "read_yaml",
    "stage_config_dict",
    "validate_config",
]
