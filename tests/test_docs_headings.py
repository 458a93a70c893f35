"""docs/ pages a reader can navigate: the site's sidebar lists a page's ``##`` headings,
so a long page without them shows nothing to jump to (issue 42). Every page over
LONG_PAGE words has at least MIN_HEADINGS of them, no stretch of it - before the first or
under one heading - runs over MAX_SECTION words, and no two headings share an anchor."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
LONG_PAGE = 600  # words: about two screens
MIN_HEADINGS = 2
MAX_SECTION = 900  # words between two places the sidebar can jump to


def prose(text: str) -> str:
    """The page without its fenced code blocks (a ``## `` in a shell block is a comment)."""
    return re.sub(r"(?ms)^```.*?^```[^\n]*$", "", text)


def sections(text: str) -> tuple[list[str], list[int]]:
    """The ``##`` headings and the words of each stretch (the first: before any)."""
    parts = re.split(r"(?m)^## (.*)$", prose(text))
    return parts[1::2], [len(p.split()) for p in parts[0::2]]


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_a_long_page_has_headings_to_jump_to(page: Path) -> None:
    text = page.read_text()
    headings, words = sections(text)
    assert len(re.findall(r"(?m)^# ", prose(text))) == 1, f"{page.name}: one # title"
    if len(prose(text).split()) <= LONG_PAGE:
        return
    assert len(headings) >= MIN_HEADINGS, f"{page.name}: {len(headings)} ## headings"
    assert max(words) <= MAX_SECTION, f"{page.name}: a stretch of {max(words)} words"
    anchors = [re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in headings]
    assert len(set(anchors)) == len(anchors), f"{page.name}: {headings}"


def test_the_check_fails_on_a_long_page_without_headings() -> None:
    page = "# Title\n\n" + "word " * 700 + "\n```sh\n## not a heading\n```\n"
    headings, words = sections(page)
    assert (headings, max(words)) == ([], 702)  # the title and 700 words
    headings, words = sections(page.replace("word " * 350, "word " * 350 + "\n\n## A\n\n", 1))
    assert headings == ["A"]
    assert words == [352, 350]
