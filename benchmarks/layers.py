"""How many layers the house stands on, and its import cycles, measured from the code's imports.

    python benchmarks/layers.py                  # the table; exit 1 past --max-layers or on a cycle
    python benchmarks/layers.py --max-layers 8

A container's children are its modules and sub-packages, each taken whole (everything inside a
sub-package counts as that sub-package). Child A stands above child B when some module in A
imports some module in B, directly, at any depth of the code (inside functions and under
TYPE_CHECKING too, as grimp and import-linter read them). A container's layers are the most
children one chain of such imports passes through; a cycle is a set of children that import
each other round.

"The house" is the top-level packages: every child of `sim` (sim.core ... sim.cli, the module
sim.assemble) beside `gpu_engine` and `calibrate`. Then each package is
measured inside in the same way (sim.results: files -> record -> stats, calibrate: gpu, profile,
published and the modules beside them, ...). These are the grains the import-linter contracts in
pyproject.toml speak of: the layers contracts order a container's children, and the
acyclic-siblings contract forbids cycles among them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOTS = ("sim", "gpu_engine", "calibrate")
HOUSE = "the house"

Edges = Mapping[str, frozenset[str]]


def cycles(edges: Edges) -> list[list[str]]:
    """The sets of nodes that import each other round (strongly connected, two or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    nodes = set(edges) | {b for bs in edges.values() for b in bs}

    def visit(start: str) -> None:  # Tarjan's algorithm, iteratively (no recursion limit)
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        part.append(top)
                        if top == node:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return sorted(found)


def longest_chain(edges: Edges) -> list[str]:
    """The longest chain of imports, top first (edges must have no cycle)."""
    best: dict[str, list[str]] = {}
    nodes = sorted(set(edges) | {b for bs in edges.values() for b in bs})

    def chain(node: str) -> list[str]:
        order = [node]  # depth first without recursion: finish a node after its imports
        while order:
            top = order[-1]
            waiting = [b for b in sorted(edges.get(top, ())) if b not in best]
            if waiting:
                order.extend(waiting)
                continue
            order.pop()
            below = max((best[b] for b in edges.get(top, ())), key=len, default=[])
            best[top] = [top, *below]
        return best[node]

    return max((chain(n) for n in nodes), key=len, default=[])


def child_edges(imports: Iterable[tuple[str, str]], child_of) -> dict[str, frozenset[str]]:
    """Module imports folded onto children: child(a) -> child(b) where they differ."""
    out: dict[str, set[str]] = {}
    for a, b in imports:
        ca, cb = child_of(a), child_of(b)
        if ca is not None and cb is not None and ca != cb:
            out.setdefault(ca, set()).add(cb)
    return {k: frozenset(v) for k, v in out.items()}


def house_child(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "sim" and len(parts) > 1 else parts[0]


def inside(package: str):
    depth = package.count(".") + 1

    def child(module: str) -> str | None:
        parts = module.split(".")
        if len(parts) <= depth or ".".join(parts[:depth]) != package:
            return None
        return ".".join(parts[: depth + 1])
    return child


def measure(repo: Path) -> list[tuple[str, bool, list[str], list[list[str]]]]:
    """(container, whether it is a package grain, its longest chain, its cycles) for the
    house and every package inside, from the code under `repo`. The package grains are the
    house and the packages that hold sub-packages; inside a flat package every child is a
    module, which the bound does not cover."""
    sys.path.insert(0, str(repo))
    import grimp

    graph = grimp.build_graph(*ROOTS, include_external_packages=False)
    imports = [(m, d) for m in graph.modules for d in graph.find_modules_directly_imported_by(m)]
    packages = sorted({m.rsplit(".", 1)[0] for m in graph.modules if "." in m} - {"sim"})
    rows = []
    for name, child_of in [(HOUSE, house_child), *((p, inside(p)) for p in packages)]:
        nested = name == HOUSE or any(q.startswith(name + ".") for q in packages)
        edges = child_edges(imports, child_of)
        loops = cycles(edges)
        rows.append((name, nested, [] if loops else longest_chain(edges), loops))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-layers", type=int, default=8,
                        help="exit 1 when the house or a package with sub-packages stands on "
                             "more (default 8)")
    parser.add_argument("--modules", action="store_true",
                        help="also the module chains inside each flat package (not bounded)")
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)
    worst = 0
    broken = False
    for name, nested, chain, loops in measure(args.repo):
        if loops:
            broken = True
            print(f"{name}: {len(loops)} cycle(s): " + "; ".join(" <-> ".join(c) for c in loops))
        elif nested or args.modules:
            worst = max(worst, len(chain) if nested else 0)
            print(f"{name}: {len(chain)} layers{'' if nested else ' of modules'}: "
                  f"{' -> '.join(chain)}")
    print(f"deepest: {worst} layers (at most {args.max_layers}); cycles: "
          f"{'some' if broken else 'none'}")
    return 1 if worst > args.max_layers or broken else 0


if __name__ == "__main__":
    sys.exit(main())
