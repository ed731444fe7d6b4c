"""The catalog: GPUs, models and storage formats as cited TOML entries in this folder.

The entries are data (``hardware/*.toml``, ``models/*.toml``, ``dtypes.toml``);
:mod:`pipeline.catalog.entries` parses and checks them. This module only names its public API.
"""

from pipeline.catalog.entries import (
    CATALOG_DIR,
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

__all__ = [
    "CATALOG_DIR",
    "Formats",
    "HardwareSpec",
    "KVFormat",
    "ModelSpec",
    "WeightFormat",
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
    "weight_format",
]
