"""The models file and the engines it names, beside the embedded one."""

from gateway.models.registry import ModelRegistry, UnknownModel
from gateway.models.schema import LoadedModels, ModelsFile, ModelsFileError, load_models_file

__all__ = [
    "LoadedModels",
    "ModelRegistry",
    "ModelsFile",
    "ModelsFileError",
    "UnknownModel",
    "load_models_file",
]
