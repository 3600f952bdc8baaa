"""The join key between vLLM's request ids and infersight's 64-bit request ids.

vLLM names a request by a string: the base id (the caller's ``X-Request-Id``, which our middleware
sets when the caller did not) behind an API prefix, and for completions a choice index::

    /v1/completions        response id "cmpl-<base>",      engine id "cmpl-<base>-<index>"
    /v1/chat/completions   response id "chatcmpl-<base>",  engine id "chatcmpl-<base>"

The middleware sees only the base; the stat logger and vLLM's spans see the engine id. Both map
to the same key: a 47-bit hash of (base, index). 47 bits, because the agent shifts each ring's ids
into its own range above bit 48 (agent.rings.ingest.RING_ID_SHIFT); key 0 is never produced (it means
"no request" in the probe records).
"""
from __future__ import annotations

import hashlib
import re

_ENGINE_ID = re.compile(r"^(?:(cmpl)-(.+)-(\d+)|(chatcmpl)-(.+)|(cmpl)-(.+))$", re.DOTALL)
KEY_BITS = 47


def base_and_index(vllm_request_id: str) -> tuple[str, int]:
    """Split an engine or response id into (base id, choice index); other ids are their own base."""
    m = _ENGINE_ID.match(vllm_request_id)
    if m is None:
        return vllm_request_id, 0
    if m.group(1):
        return m.group(2), int(m.group(3))
    if m.group(4):
        return m.group(5), 0
    return m.group(7), 0


def join_key(base_id: str, index: int = 0) -> int:
    """The request id infersight records for choice ``index`` of the request with ``base_id``."""
    digest = hashlib.blake2b(f"{index}:{base_id}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    key = int.from_bytes(digest, "little") & ((1 << KEY_BITS) - 1)
    return key or 1


def key_for_vllm_id(vllm_request_id: str) -> int:
    """The join key of any vLLM request id (engine id, response id or span ``gen_ai.request.id``)."""
    return join_key(*base_and_index(vllm_request_id))
