"""The command line: `main` parses the arguments and hands each command to its module (`run`
for compile / run / devices, `explain`, `tune`, `graph` for graphs and ONNX models, `cache`,
`bench`)."""

from .main import main

__all__ = ["main"]
