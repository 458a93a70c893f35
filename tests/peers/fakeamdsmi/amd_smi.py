"""A stand-in for AMD's ``amd-smi`` command line tool: ``amd-smi list --json`` and
``amd-smi metric --json`` print the files ``list.json`` and ``metric.json`` of the
directory in $FAKE_AMD_SMI_DIR, as the real tool prints its JSON (amdsmi CHANGELOG,
"Added units of measure to JSON output": a list of objects, one per GPU, numbers as
``{"value": v, "unit": u}``). Anything else exits 2 as the real tool does for an unknown
command. ``exit_code`` in that directory makes it fail with that status."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> int:
    here = Path(os.environ["FAKE_AMD_SMI_DIR"])
    if (here / "exit_code").exists():
        print("amd-smi: error: the GPU driver is not loaded", file=sys.stderr)
        return int((here / "exit_code").read_text())
    if len(sys.argv) != 3 or sys.argv[2] != "--json" or sys.argv[1] not in ("list", "metric"):
        print(f"amd-smi: error: unrecognized arguments: {' '.join(sys.argv[1:])}",
              file=sys.stderr)
        return 2
    sys.stdout.write((here / f"{sys.argv[1]}.json").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
