"""vLLM's API-key check: which routes it guards and how a key is compared.

The key comes from --api-key, VLLM_API_KEY or SERVESIM_API_KEY (sim.cli.serve);
/health and /metrics stay open, as in vLLM, so scrapers and probes need no key.
"""

from __future__ import annotations

import hashlib
import hmac

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")  # vLLM's, for its API key


def key_matches(header: str | None, api_key: str) -> bool:
    """`Authorization: Bearer KEY`, the scheme in any case, as vLLM checks it: both keys are
    hashed first, so the comparison takes the same time whatever they hold and however
    long they are."""
    scheme, _, token = (header or "").partition(" ")
    given = hashlib.sha256(token.encode("utf-8", "backslashreplace")).digest()
    wanted = hashlib.sha256(api_key.encode("utf-8", "backslashreplace")).digest()
    return hmac.compare_digest(given, wanted) and scheme.lower() == "bearer"


def needs_key(method: str, path: str) -> bool:
    """vLLM's guarded routes: /v1 (and its other API prefixes), never OPTIONS; /health,
    /metrics and the rest stay open."""
    return method != "OPTIONS" and path.startswith(GUARDED_PREFIXES)
