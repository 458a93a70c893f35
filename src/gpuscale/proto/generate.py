"""Regenerate the protobuf and gRPC modules: ``python -m gpuscale.proto.generate``.

Needs grpcio-tools (a dev dependency). The test suite runs the same generation into a
temporary directory and fails when the committed modules differ (drift check).
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_DIR = Path(__file__).parent
SRC = PROTO_DIR.parent.parent  # .../src: generated imports read "from gpuscale.proto import"
PROTOS = sorted(PROTO_DIR.glob("*.proto"))


def generate(out_dir: Path = SRC) -> list[Path]:
    """Write ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` under ``out_dir``."""
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    for proto in PROTOS:
        rel = proto.relative_to(SRC)
        code = protoc.main(["grpc_tools.protoc", f"-I{SRC}", f"--python_out={out_dir}",
                            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", str(rel)])
        if code != 0:
            raise RuntimeError(f"protoc failed on {rel} (exit {code})")
    return sorted(p for p in (out_dir / "gpuscale" / "proto").glob("*_pb2*")
                  if p.suffix in (".py", ".pyi"))


if __name__ == "__main__":
    for path in generate():
        print(path.relative_to(SRC.parent) if path.is_relative_to(SRC.parent) else path)
    sys.exit(0)
