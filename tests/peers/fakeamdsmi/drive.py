"""Runs the AMD backend under the fake library (ROCM_PATH and FAKEAMDSMI_CONFIG set by the
caller) through the agent's attribution once, against the given peers:
``drive.py KUBELET_SOCKET PROC_ROOT KUBECONFIG NODE [SYS_ROOT]`` prints {"snapshot": ...,
"attribution": ..., "signals": {"ns/pod": {signal: value}}} as fakenvml's driver does."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from gpuscale.telemetry.amdsmi_backend import AmdSmiBackend
from tests.peers.fakenvml.drive import attribute_once


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    sys_root = Path(sys.argv[5]) if len(sys.argv) > 5 else Path("/nonexistent-sys")
    backend = AmdSmiBackend("test-node", sys_root=sys_root)
    try:
        print(json.dumps(asyncio.run(attribute_once(backend, *sys.argv[1:5]))), flush=True)
    finally:
        backend.close()


if __name__ == "__main__":
    main()
