"""The import graph of src/ has no cycle: import-linter's layer contract (pyproject.toml,
run by ./dev test) keeps packages in order; this keeps modules inside a package from
importing each other in a circle, which a layer contract cannot see."""

from __future__ import annotations

import grimp


def _cycle_from(graph: grimp.ImportGraph, start: str) -> list[str] | None:
    """A shortest chain from a module that imports ``start`` back to ``start``, if any."""
    for importer in sorted(graph.find_modules_that_directly_import(start)):
        if importer.startswith("gpuscale."):
            chain = graph.find_shortest_chain(importer=start, imported=importer)
            if chain is not None:
                return [*chain, start]
    return None


def test_no_module_is_part_of_an_import_cycle() -> None:
    graph = grimp.build_graph("gpuscale")
    modules = sorted(m for m in graph.modules if m.startswith("gpuscale."))
    assert len(modules) > 50  # the graph really holds the package
    cycles = [c for m in modules if (c := _cycle_from(graph, m)) is not None]
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles[:10])


def test_the_cycle_check_finds_a_cycle() -> None:
    """The check above can fail: a graph with a planted cycle is reported."""
    graph = grimp.build_graph("gpuscale")
    graph.add_import(importer="gpuscale.common.errors", imported="gpuscale.cli")
    chain = _cycle_from(graph, "gpuscale.common.errors")
    assert chain is not None
    assert chain[0] == chain[-1] == "gpuscale.common.errors"
