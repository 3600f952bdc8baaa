"""Prometheus / dcgm-exporter scrape text: seeded mutations of real scrapes (our H200 dcgm-exporter
4.9 body; the public dcgm-exporter, vLLM and SGLang samples when present). `analyze_exposition`
promises never to raise (bad text becomes a warning); `parse_exposition` and vLLM's
`parse_vllm_text` raise ValueError only; none may hang or allocate without bound."""
from __future__ import annotations

import pytest
from fuzzkit import case_count, check, mutations, run_fuzz
from real_inputs import FIXTURES, OUR_DCGM

from infersight.exporters.exposition_parse import MAX_MESSAGE_CHARS, UNEXPLAINED
from infersight.gpu.analyze import analyze_exposition, format_exposition_table
from infersight.gpu.exporter_text import parse_exposition
from infersight.sources.vllm.metrics import parse_vllm_text

SEED = 1705


def _seeds(*names: str) -> list[bytes]:
    return [(FIXTURES / n).read_bytes() for n in names if (FIXTURES / n).is_file()]


def _dcgm(case: bytes) -> object:
    text = case.decode("utf-8", "replace")
    parse_exposition(text, 0)
    return format_exposition_table(analyze_exposition(text))


def _vllm(case: bytes) -> object:
    return parse_vllm_text(case.decode("utf-8", "replace"))


def test_fuzz_dcgm_exposition() -> None:
    seeds = [OUR_DCGM.read_bytes()] + _seeds("dcgm_exporter_l4.prom", "dcgm_exporter_a100_mig.prom")
    _dcgm(seeds[0])
    check("dcgm scrape", run_fuzz(_dcgm, mutations(seeds, case_count(300), SEED), allowed=(ValueError,),
                                  per_case_s=5.0))


def test_fuzz_analyze_exposition_never_raises() -> None:
    seeds = [OUR_DCGM.read_bytes()]
    cases = mutations(seeds, case_count(100), SEED + 1)  # CI: 100; a long run: as many as the others
    check("dcgm analyze_exposition", run_fuzz(
        lambda c: format_exposition_table(analyze_exposition(c.decode("utf-8", "replace"))), cases, allowed=(),
        per_case_s=5.0))


def test_fuzz_vllm_metrics() -> None:
    seeds = _seeds("vllm_metrics_sample.prom")
    if not seeds:
        pytest.skip(f"public fixture vllm_metrics_sample.prom is not in {FIXTURES}: nothing real to mutate")
    _vllm(seeds[0])
    check("vllm scrape", run_fuzz(_vllm, mutations(seeds, case_count(150), SEED), allowed=(ValueError,),
                                  per_case_s=5.0))


@pytest.mark.parametrize("value", ["9" * 400, "1e999999", "-1e999", "NaN", "+Inf"])
def test_regression_huge_sample_value(value: str) -> None:
    # was: OverflowError on a 400-digit sample value, as a traceback
    text = f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="GPU-1"}} {value}\n'
    result = analyze_exposition(text)
    format_exposition_table(result)
    assert result["gpus"] and result["gpus"][0]["gpu"] == 0


def test_regression_huge_gpu_label_is_skipped_not_raised() -> None:
    text = f'DCGM_FI_DEV_GPU_TEMP{{gpu="{"9" * 5000}",UUID="GPU-1"}} 40\n'
    result = analyze_exposition(text)
    assert result["samples"] == [] and any("without a numeric `gpu` label" in w for w in result["warnings"])


def test_regression_vllm_huge_counter_is_a_value_error() -> None:
    text = "# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{model_name=\"m\"} " + "9" * 400 + "\n"
    with pytest.raises(ValueError, match="too large for a float"):
        parse_vllm_text(text)
    assert parse_vllm_text(text.replace("9" * 400, "12")).values  # the same text with a sane value reads


@pytest.mark.parametrize("text", ['# TYPE 9bad counter\n', '# HELP 9bad x\n', '{a="1"} 1\n', '# TYPE m\n'])
def test_regression_a_bare_parser_refusal_is_a_clear_error(text: str) -> None:
    # found by the 10,000-case run's clarity check: prometheus_client raises ValueError() with no
    # message for these lines; the scrape error, the analyze warning and the vLLM scrape said nothing
    for parse in (lambda t: parse_exposition(t, 0), parse_vllm_text):
        with pytest.raises(ValueError) as err:
            parse(text)
        assert str(err.value) == UNEXPLAINED
    assert analyze_exposition(text)["warnings"] == [f"not valid Prometheus text: {UNEXPLAINED}"]


def test_regression_a_refusal_quoting_a_long_line_stays_short() -> None:
    # the parser repeats the whole label text in its complaint; 100,000 characters of it, logged
    # once per failing scrape, are cut to MAX_MESSAGE_CHARS and a count
    labels = 'gpu="0",' + 'x' * 100_000
    with pytest.raises(ValueError) as err:
        parse_exposition(f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 1\n", 0)
    message = str(err.value)
    assert message.endswith(f"... ({len('Invalid labels: ' + labels) - MAX_MESSAGE_CHARS} more characters)")
    assert len(message) < MAX_MESSAGE_CHARS + 40 and "\n" not in message
