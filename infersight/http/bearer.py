"""The bearer-token check the servers share (the agent's capture endpoint, `infersight mcp` over HTTP)."""
from __future__ import annotations

import hmac


def bearer_matches(authorization: str, token: str) -> bool:
    """Whether an Authorization header carries `token` as Bearer credentials (scheme in any case,
    RFC 7235 2.1); compared in constant time, as bytes (a non-ASCII header is just a mismatch)."""
    scheme, _, credentials = authorization.strip().partition(" ")
    ok_scheme = scheme.lower() == "bearer"
    return hmac.compare_digest(credentials.strip().encode("latin-1", "replace"), token.encode()) and ok_scheme
