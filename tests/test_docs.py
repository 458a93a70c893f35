"""The README a newcomer reads first: two screens, every link to a page that exists, and
its ScaledObject one that KEDA and the scaler accept."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpuscale.scaler.core.trigger import parse_metadata
from tests.support.schemas import validate

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_fits_on_two_screens() -> None:
    lines = README.splitlines()
    assert len(lines) <= 100
    assert max(len(line) for line in lines) <= 100
    assert lines[2:6] == ["```sh", lines[3], lines[4], "```"]  # the two commands, first
    assert lines[3].startswith("./dev run ")
    assert lines[4].startswith("./dev test ")


def test_every_link_leads_to_a_page() -> None:
    links = re.findall(r"\]\(([^)]+)\)", README)
    assert links
    for link in links:
        assert (ROOT / link).is_file(), link
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = {next(iter(entry.values())) for entry in nav}
    assert pages == {p.name for p in (ROOT / "docs").glob("*.md")}  # none left out


def test_the_readmes_scaled_object_is_accepted() -> None:
    block = README[README.index("```yaml") + 7:]
    so = yaml.safe_load(block[:block.index("```")])
    validate(so)  # KEDA's CRD
    (trigger,) = so["spec"]["triggers"]
    metadata = {k: v for k, v in trigger["metadata"].items() if k != "scalerAddress"}
    assert parse_metadata(metadata).planner is not None
