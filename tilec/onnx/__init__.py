"""The ONNX importer: a model -> a `tilec.Graph` (`importer`, with one converter per ONNX op in
`converters`) -> passes -> one Tile program -> kernels."""

from .importer import (
    SUPPORTED_OPS,
    OnnxExecutable,
    check_supported,
    load,
    read_model,
    to_graph,
    unsupported_ops,
)

__all__ = ["OnnxExecutable", "SUPPORTED_OPS", "check_supported", "load", "read_model",
           "to_graph", "unsupported_ops"]
