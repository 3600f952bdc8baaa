"""The engine name a vLLM process announces on its ring (an ENGINE record, probes.records), so that an
agent reading several rings labels each engine's series with it (agent.rings.engine_scope).

One vLLM engine writes several rings: the API server's (writer.py) and one per worker for the MoE
expert counts (experts.py). They all announce the same name, so that a tensor-parallel engine is one
`engine` label value, not one per ring: ``INFERSIGHT_ENGINE_NAME`` from the server's environment
(which vLLM's workers inherit), default ``vllm``, plus ``-dp<rank>`` for a data-parallel rank above 0.
"""
from __future__ import annotations

from typing import Mapping

from infersight.probes.records import ENGINE_NAME_BYTES, valid_engine_name

ENGINE_NAME_ENV = "INFERSIGHT_ENGINE_NAME"
DEFAULT_ENGINE_NAME = "vllm"


def vllm_engine_name(env: Mapping[str, str], dp_rank: int = 0) -> str:
    """The name from env (an invalid one: the default; see engine_name_problem), with ``-dp<rank>``
    for a data-parallel rank above 0, cut so that the suffix always fits."""
    given = env.get(ENGINE_NAME_ENV, "").strip()
    base = given if valid_engine_name(given) else DEFAULT_ENGINE_NAME
    suffix = f"-dp{dp_rank}" if dp_rank > 0 else ""
    return base[:ENGINE_NAME_BYTES - len(suffix)] + suffix


def engine_name_problem(env: Mapping[str, str]) -> str | None:
    """Why the environment's name was not used (None: it was, or none was given)."""
    given = env.get(ENGINE_NAME_ENV, "").strip()
    if given and not valid_engine_name(given):
        return (f"{ENGINE_NAME_ENV}={given!r} is not 1 to {ENGINE_NAME_BYTES} printable ASCII characters "
                f"without spaces; using {DEFAULT_ENGINE_NAME!r}")
    return None
