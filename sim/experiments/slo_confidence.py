"""The SLO search at a confidence: which confidence a compare runs at, and the base's SLO bounds
it tightens.

A compare spec may state `confidence:` beside the search's other settings (`slo_threshold`,
`bisect_steps`, ...); `servesim compare --confidence` overrides it. Both go through
`resolve` (one check, sim.results.stats.prediction.check_confidence) and `tighten`, so a
spec's field and the option give the same runs and the same answer (docs/uncertainty.md).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from sim.results.stats.prediction import check_confidence


def resolve(stated: float | None, option: float | None, source: str) -> float | None:
    """The confidence the search runs at: `option` (--confidence) over `stated` (the spec's
    field), each checked under its own name; None: a point-estimate search."""
    if option is not None:
        return check_confidence(option, "--confidence")
    return check_confidence(stated, f"{source}: confidence")


def tighten(raw: dict[str, Any], confidence: float, variant_keys: Iterable[tuple[str, str]]
            ) -> tuple[dict[str, Any], str]:
    """The base scenario with each SLO bound divided by the model error's factor at
    `confidence` (sim.results.stats.prediction.tightened_slo), and a line saying what they
    became ('' without bounds). `variant_keys`: (variant, key) each variant overrides; one
    that sets an SLO bound is refused (ValueError), since the search reads the base's
    bounds and a variant's own would go untightened."""
    from sim.results.stats.model_error import load_description
    from sim.results.stats.prediction import tightened_slo

    for name, key in variant_keys:
        if key == "slo" or key.startswith("slo."):
            raise ValueError(f"confidence: variant {name!r} sets {key}; at a confidence the "
                             "SLO search tightens the base's bounds, so variants may not set "
                             "their own")
    given = {k: v for k, v in (raw.get("slo") or {}).items()
             if isinstance(v, int | float) and not isinstance(v, bool)}
    tight = {k: v for k, v in tightened_slo(given, confidence, load_description()).items()
             if v is not None}
    if not tight:
        return raw, ""
    out = copy.deepcopy(raw)
    out["slo"] = {**(out.get("slo") or {}), **tight}
    said = ", ".join(f"{k} {given[k]:g} -> {v:.4g}" for k, v in tight.items())
    return out, (f"SLO search at {confidence:.0%} confidence: bounds the runs meet {said} "
                 "(the model error's factor), and attainment's 95% lower bound must reach "
                 "the threshold")
