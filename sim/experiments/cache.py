"""Finished points of a compare, sweep or plan, kept so a killed experiment resumes.

Why: a long search killed at 90% should not start over. Each finished point's
plain result is written, as it lands, to `<dir>/<key>.json` (written whole
to a temporary name, then renamed: a kill never leaves half a file). The key
is a sha256 of the resolved scenario (every field, defaults filled in), the
digest of the request stream it produces (so a trace file's content counts),
the servesim version and scenario schema version, and the git commit when
servesim runs from its checkout (so a code change is a new point). A point
with its own output directory (sweep --plots) is not cached: its files would
not be rebuilt from the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE_DIR = ".servesim-cache"


def code_identity() -> str:
    """The servesim version, schema version and commit (if any) a cached point belongs to."""
    from sim.results.files.provenance import provenance

    p = provenance()
    return f"{p['servesim_version']}/{p['scenario_schema_version']}/{p['git_commit']}"


def point_key(scenario_json: str, stream_digest: str, code: str) -> str:
    """The cache key of one point (hex sha256)."""
    h = hashlib.sha256()
    for part in (scenario_json, stream_digest, code):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class PointCache:
    """Results by key under `root` (None: caching off)."""

    root: Path | None
    code: str = ""

    @classmethod
    def beside(cls, out_dir: Path | None) -> PointCache:
        """The cache for results written to `out_dir`: `.servesim-cache/` in its parent."""
        if out_dir is None:
            return cls(None)
        return cls(Path(out_dir).resolve().parent / CACHE_DIR / "points", code_identity())

    def key(self, task: Any, stream_digest: Callable[..., tuple[str, int, float]]
            ) -> str | None:
        """A task's key (`stream_digest`: the runner's); None when it is not cached (no
        cache, or the task writes its own files)."""
        if self.root is None or task.out_dir is not None:
            return None
        scenario_json = json.dumps(task.scenario.model_dump(mode="json"), sort_keys=True)
        digest, count, span_s = stream_digest(task.scenario, task.base_dir)
        return point_key(scenario_json, f"{digest}/{count}/{span_s!r}", self.code)

    def get(self, key: str | None) -> dict[str, Any] | None:
        if key is None or self.root is None:
            return None
        try:
            return json.loads((self.root / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None  # absent, or unreadable: run the point again

    def put(self, key: str | None, result: dict[str, Any]) -> None:
        if key is None or self.root is None or "error" in result:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{key}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result, allow_nan=False))
        os.replace(tmp, path)
