"""Generated protobuf modules match their .proto sources (python -m gpuscale.proto.generate)."""

from __future__ import annotations

from pathlib import Path

from gpuscale.proto.generate import PROTO_DIR, generate


def test_generated_modules_have_not_drifted(tmp_path: Path) -> None:
    fresh = generate(tmp_path)
    assert fresh, "no .proto sources found"
    for path in fresh:
        committed = PROTO_DIR / path.name
        assert committed.exists(), f"{path.name} is not committed: run the generator"
        assert committed.read_bytes() == path.read_bytes(), (
            f"{path.name} differs from its .proto: run python -m gpuscale.proto.generate")
