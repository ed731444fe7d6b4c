"""The catalog: GPUs, models and storage formats as cited TOML entries in this folder.

The entries are data (``hardware/*.toml``, ``models/*.toml``, ``dtypes.toml``);
:mod:`pipeline.catalog.entries` parses and checks them; :mod:`pipeline.catalog.names` says which
catalog model a model name as logs spell it names. This module only names its public API.
"""

from pipeline.catalog.entries import (
    CATALOG_DIR,
    MIN_EFFICIENCY,
    Formats,
    HardwareSpec,
    KVFormat,
    ModelSpec,
    WeightFormat,
    entry_path,
    hardware_dir,
    hardware_to_toml,
    import_hf_config,
    kv_format,
    list_hardware,
    list_models,
    load_formats,
    load_hardware,
    load_hardware_file,
    load_model,
    load_model_file,
    model_from_hf_config,
    model_to_toml,
    models_dir,
    parse_hardware,
    parse_model,
    weight_format,
)
from pipeline.catalog.names import NameMatch, canonical_model_names, resolve_model_name, resolve_model_names

__all__ = [
    "CATALOG_DIR",
    "MIN_EFFICIENCY",
    "Formats",
    "HardwareSpec",
    "KVFormat",
    "ModelSpec",
    "NameMatch",
    "WeightFormat",
    "canonical_model_names",
    "entry_path",
    "hardware_dir",
    "hardware_to_toml",
    "import_hf_config",
    "kv_format",
    "list_hardware",
    "list_models",
    "load_formats",
    "load_hardware",
    "load_hardware_file",
    "load_model",
    "load_model_file",
    "model_from_hf_config",
    "model_to_toml",
    "models_dir",
    "parse_hardware",
    "parse_model",
    "resolve_model_name",
    "resolve_model_names",
    "weight_format",
]
