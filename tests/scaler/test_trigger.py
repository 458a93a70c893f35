"""Trigger metadata and label selectors: a table for every key, hypothesis for the rest."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.scaler.core.planner import Planner
from gpuscale.scaler.core.profiles import PROFILES, SIGNALS, ProfileName
from gpuscale.scaler.core.selector import SelectorError, parse_selector
from gpuscale.scaler.core.trigger import KNOWN, MetadataError, parse_metadata


def test_defaults_and_passthrough_keys() -> None:
    cfg = parse_metadata({"podSelector": "app=x", "scalerAddress": "gpuscale:6000",
                          "caCert": "...", "tlsClientCert": "...", "tlsClientKey": "..."})
    assert cfg.profile == "gpu-utilization"
    assert [(t.signal, t.target, t.activation) for t in cfg.targets] == [
        ("gpu-utilization", 70.0, 5.0)]
    assert cfg.value_mode == "sum"
    assert cfg.metric_name(cfg.targets[0]) == "gpuscale-gpu-utilization"
    assert cfg.target_for("s0-gpuscale-gpu-utilization") is cfg.targets[0]
    assert cfg.target_for("gpuscale-vllm-waiting") is None


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile(profile: ProfileName) -> None:
    cfg = parse_metadata({"profile": profile, "podSelector": "app=x"})
    assert cfg.targets == PROFILES[profile].targets


@pytest.mark.parametrize(("md", "expect"), [
    ({"profile": "vllm-inference", "signal": "vllm-kv-cache"}, [("vllm-kv-cache", 80.0, 0.0)]),
    ({"profile": "vllm-inference", "signal": "vllm-running", "targetValue": "12"},
     [("vllm-running", 12.0, 0.0)]),
    ({"targetValue": "55.5", "activationThreshold": "0"}, [("gpu-utilization", 55.5, 0.0)]),
    ({"signal": "gpu-memory", "targetValue": "60"}, [("gpu-memory", 60.0, 0.0)]),
    ({"profile": "triton-inference", "activationThreshold": "2"},
     [("triton-pending", 10.0, 2.0), ("triton-queue-time", 50.0, 2.0)]),
])
def test_signal_target_and_activation(md: dict[str, str],
                                      expect: list[tuple[str, float, float]]) -> None:
    cfg = parse_metadata(md)
    assert [(t.signal, t.target, t.activation) for t in cfg.targets] == expect


@pytest.mark.parametrize(("md", "mode"), [
    ({}, "sum"), ({"valueMode": "average"}, "average"), ({"metricType": "Value"}, "average"),
    ({"metricType": "AverageValue"}, "sum"),
    ({"metricType": "Value", "valueMode": "average"}, "average")])
def test_value_mode(md: dict[str, str], mode: str) -> None:
    assert parse_metadata(md).value_mode == mode


@pytest.mark.parametrize(("md", "message"), [
    ({"profile": "llm"}, "profile: 'llm' is not one of batch, gpu-utilization,"),
    ({"signal": "gpu-temp"}, "signal: 'gpu-temp' is not one of gpu-memory,"),
    ({"signal": "vllm-running"}, "targetValue: required with signal 'vllm-running'"),
    ({"profile": "vllm-inference", "targetValue": "5"},
     "targetValue: profile 'vllm-inference' has 2 signals"),
    ({"targetValue": "abc"}, "targetValue: 'abc' is not a number"),
    ({"targetValue": "0"}, "targetValue: must be at least 0.001 (KEDA passes targets"),
    ({"targetValue": "0.0009"}, "targetValue: must be at least 0.001"),
    ({"targetValue": "-3"}, "targetValue: must be between 0.001 and 1e+15, got '-3'"),
    ({"targetValue": "1e16"}, "targetValue: must be between 0.001 and 1e+15"),
    ({"targetValue": "9223372036854775808"}, "targetValue: must be between 0.001 and 1e+15"),
    ({"targetValue": "nan"}, "targetValue: 'nan' is not a number (digits 0-9"),
    ({"targetValue": "inf"}, "targetValue: 'inf' is not a number"),
    ({"targetValue": "\u096d\u0966"}, "targetValue: '\u096d\u0966' is not a number"),
    ({"targetValue": "1_000"}, "targetValue: '1_000' is not a number"),
    ({"targetValue": " 5"}, "targetValue: ' 5' is not a number"),
    ({"targetValue": "0x10"}, "targetValue: '0x10' is not a number"),
    ({"activationThreshold": "-1"}, "activationThreshold: must be between 0 and 1e+15"),
    ({"targetValue": "5", "targetValueFromEnv": "6"},
     "targetValueFromEnv: give targetValue or targetValueFromEnv, not both"),
    ({"hostFromEnv": "x"}, "hostFromEnv: gpuscale does not fetch addresses"),
    ({"valueMode": "max"}, "valueMode: 'max' is not one of average, sum"),
    ({"metricType": "Utilization"}, "metricType: 'Utilization' is not one of AverageValue"),
    ({"metricType": "Value", "valueMode": "sum"}, "valueMode: 'sum' contradicts metricType"),
    ({"podSelector": "app in (a,"}, "podSelector: unbalanced '('"),
    ({"podSelector": ""}, "podSelector: empty"),
    ({"demandSource": "http://x"}, "demandSource: a name"),
    ({"vllmEndpoint": "http://10.0.0.1:8000/metrics"},
     "vllmEndpoint: gpuscale does not fetch addresses from ScaledObject metadata"),
    ({"tritonEndpoint": "x"}, "tritonEndpoint: gpuscale does not fetch addresses"),
    ({"prometheusURL": "x"}, "prometheusURL: gpuscale does not fetch addresses"),
    ({"gpuIndex": "0"}, "gpuIndex: unknown key; valid keys: activationThreshold, "),
])
def test_bad_metadata_names_the_key(md: dict[str, str], message: str) -> None:
    with pytest.raises(MetadataError) as err:
        parse_metadata(md)
    assert message in str(err.value)


@pytest.mark.parametrize(("text", "value"), [
    ("0.001", 0.001), ("1", 1.0), ("+2.5", 2.5), (".5", 0.5), ("5.", 5.0), ("1e3", 1000.0),
    ("1E-2", 0.01), ("1e15", 1e15)])
def test_numbers_keda_accepts(text: str, value: float) -> None:
    assert parse_metadata({"targetValue": text}).targets[0].target == value


def test_from_env_keys_carry_the_value_keda_resolved() -> None:
    """KEDA replaces a ``...FromEnv`` key's value with the container's variable before the
    call (pkg/scalers/external_scaler.go, parseExternalScalerMetadata), keeping the key."""
    cfg = parse_metadata({"profileFromEnv": "vllm-inference", "signal": "vllm-waiting",
                          "targetValueFromEnv": "4", "podSelectorFromEnv": "app=vllm"})
    assert (cfg.profile, cfg.targets[0].target) == ("vllm-inference", 4.0)
    assert cfg.selector is not None
    assert cfg.selector.text == "app=vllm"


def test_oversized_metadata() -> None:
    with pytest.raises(MetadataError, match="more than 64 metadata keys"):
        parse_metadata({f"k{i}": "v" for i in range(100)})
    with pytest.raises(MetadataError, match="longer than 4096"):
        parse_metadata({"podSelector": "a=" + "b" * 5000})
    with pytest.raises(MetadataError, match="longer than 16384 characters in all"):
        parse_metadata({f"k{i}": "v" * 4000 for i in range(5)})


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(
    st.sampled_from([*KNOWN, "scalerAddress", "x", "fooEndpoint"]) | st.text(max_size=12),
    st.sampled_from([*PROFILES, *SIGNALS, "1", "0", "-1", "1e309", "nan", "Value",
                     "AverageValue", "sum", "average", "app=x", "app in (a,b)", "!x", ""])
    | st.text(max_size=30), max_size=8))
def test_any_metadata_gives_a_config_or_metadata_error(md: dict[str, str]) -> None:
    try:
        cfg = parse_metadata(md)
    except MetadataError as exc:
        message = str(exc)
        assert message, "an error must say what is wrong"
        return
    assert cfg.targets
    assert all(0.001 <= t.target <= 1e15 and 0 <= t.activation <= 1e15
               for t in cfg.targets)


@pytest.mark.parametrize(("text", "labels", "match"), [
    ("app=vllm", {"app": "vllm"}, True),
    ("app==vllm", {"app": "vllm"}, True),
    ("app=vllm", {"app": "tgi"}, False),
    ("app!=vllm", {}, True),
    ("app!=vllm", {"app": "vllm"}, False),
    ("app in (vllm, tgi),tier notin (dev)", {"app": "tgi", "tier": "prod"}, True),
    ("app in (vllm,tgi),tier notin (dev)", {"app": "tgi", "tier": "dev"}, False),
    ("gpu", {"gpu": ""}, True),
    ("!gpu", {"gpu": ""}, False),
    ("!gpu", {"app": "x"}, True),
    ("example.com/team=ml, app=a", {"example.com/team": "ml", "app": "a"}, True),
])
def test_selector_matching(text: str, labels: dict[str, str], match: bool) -> None:
    assert parse_selector(text).matches(labels) is match


@pytest.mark.parametrize("text", ["", "app=", "=x", "app in ()", "app in (a,,b)",
                                  "app notin a", "a b", "app=(x)", "Bad_Prefix./x=1",
                                  "a" * 64 + "=1", "app=" + "v" * 64, "(", "a=1)"])
def test_selector_errors(text: str) -> None:
    if text == "app=":
        assert parse_selector(text).matches({"app": ""})  # empty value is valid
        return
    with pytest.raises(SelectorError):
        parse_selector(text)


@given(st.text(max_size=80))
def test_any_selector_text_parses_or_raises_selector_error(text: str) -> None:
    try:
        sel = parse_selector(text)
    except SelectorError:
        return
    sel.matches({"app": "x"})


def test_planner_profile_defaults_and_keys() -> None:
    cfg = parse_metadata({"profile": "vllm-planner"})
    assert [(t.signal, t.target) for t in cfg.targets] == [("planned-replicas", 1.0)]
    assert cfg.metric_name(cfg.targets[0]) == "gpuscale-planned-replicas"
    assert cfg.planner is not None
    # ttftSeconds 2 (default) less the prefill of a 1000-token prompt at 30k tokens/s,
    # until the engines show their own prompts.
    assert cfg.planner.delay_s == pytest.approx(2.0 - 1000 / 30_000)
    assert cfg.planner.ttft_s == 2.0
    cfg = parse_metadata({"profile": "vllm-planner", "queueDelaySeconds": "0.5",
                          "startupSeconds": "240", "prefillTokensPerSecond": "20000",
                          "decodeTokensPerSecond": "8000", "maxBatch": "128",
                          "utilization": "0.7", "holdSeconds": "600", "memorySeconds": "3600",
                          "drainSeconds": "600", "targetValue": "10"})
    p = cfg.planner
    assert p is not None
    assert (p.delay_s, p.startup_s, p.prefill_tps, p.decode_tps, p.max_batch, p.utilization,
            p.hold_s, p.memory_s, p.drain_s) == (0.5, 240.0, 20_000.0, 8_000.0, 128, 0.7,
                                                 600.0, 3600.0, 600.0)
    assert p.ttft_s is None  # a queue-delay objective does not move with the prompts
    assert cfg.targets[0].target == 10.0
    none = parse_metadata({"profile": "vllm-planner", "holdSeconds": "0"}).planner
    assert none is not None
    assert Planner(none).hold() == 0.0  # the documented range starts at 0
    short = parse_metadata({"profile": "vllm-planner", "startupSeconds": "90"}).planner
    assert short is not None
    assert Planner(short).hold() == 90.0  # the hold follows the start-up time unless given
    measured = parse_metadata({"profile": "vllm-planner"}).planner
    assert measured is not None
    assert measured.startup_s is None  # measured from the pods
    assert measured.drain_s == 30.0  # Kubernetes' default terminationGracePeriodSeconds
    for bad in ("-1", "86401", "soon"):
        with pytest.raises(MetadataError, match="drainSeconds"):
            parse_metadata({"profile": "vllm-planner", "drainSeconds": bad})
    assert (Planner(measured).startup, Planner(measured).startup_source) == (300.0, "default")


def test_a_prompt_aware_objective_is_planned_at_the_prompts_shown() -> None:
    """ttftSecondsPerPromptToken: the objective gpuscale simulate --slo ttft-per-token
    judges (1 s + 0.5 ms a prompt token), planned for at the mean prompt the engines show
    (promptTokens until they have)."""
    md = {"profile": "vllm-planner", "ttftSeconds": "1", "ttftSecondsPerPromptToken": "0.0005",
          "promptTokens": "12000"}
    p = parse_metadata(md).planner
    assert p is not None
    assert (p.ttft_s, p.ttft_per_token_s) == (1.0, 0.0005)
    assert Planner(p).delay() == pytest.approx(1.0 + 0.0005 * 12_000 - 12_000 / 30_000)
    # Without promptTokens: at the default 1000-token prompt; without ttftSeconds: 2 s on top.
    p = parse_metadata({"profile": "vllm-planner",
                        "ttftSecondsPerPromptToken": "0.001"}).planner
    assert p is not None
    assert Planner(p).delay() == pytest.approx(3.0 - 1_000 / 30_000)
    # An objective the configured prompt's prefill alone would miss is refused.
    with pytest.raises(MetadataError, match=r"ttftSeconds: 0\.11s leaves no time to queue"):
        parse_metadata({"profile": "vllm-planner", "ttftSeconds": "0.01",
                        "ttftSecondsPerPromptToken": "0.0001", "promptTokens": "1000",
                        "prefillTokensPerSecond": "1000"})
    zero = parse_metadata({"profile": "vllm-planner", "ttftSecondsPerPromptToken": "0"})
    assert zero.planner == parse_metadata({"profile": "vllm-planner"}).planner
    assert "ttftSecondsPerPromptToken" in KNOWN


@pytest.mark.parametrize(("md", "message"), [
    ({"startupSeconds": "90"}, "startupSeconds: only with profile vllm-planner"),
    ({"ttftSecondsPerPromptToken": "0.001"},
     "ttftSecondsPerPromptToken: only with profile vllm-planner"),
    ({"profile": "vllm-planner", "ttftSecondsPerPromptToken": "0.001",
      "queueDelaySeconds": "1"}, "not both"),
    ({"profile": "vllm-planner", "ttftSecondsPerPromptToken": "0.5"},
     "ttftSecondsPerPromptToken: must be between 0 and 0.1"),
    ({"profile": "vllm-planner", "ttftSecondsPerPromptToken": "-1e-3"},
     "ttftSecondsPerPromptToken: must be between"),
    ({"profile": "vllm-planner", "ttftSecondsPerPromptToken": "5e-4 "},
     "ttftSecondsPerPromptToken: '5e-4 ' is not a number"),
    ({"profile": "vllm-planner", "ttftSecondsPerPromptToken": "inf"},
     "ttftSecondsPerPromptToken: 'inf' is not a number"),
    ({"profile": "vllm-planner", "ttftSecondsPerPromptToken": "1" * 400},
     "ttftSecondsPerPromptToken: must be between"),
    ({"profile": "vllm-planner", "ttftSeconds": "1", "queueDelaySeconds": "1"}, "not both"),
    ({"profile": "vllm-planner", "ttftSeconds": "0.02"}, "leaves no time to queue"),
    ({"profile": "vllm-planner", "utilization": "1.5"}, "utilization: must be between"),
    ({"profile": "vllm-planner", "startupSeconds": "1e9"}, "startupSeconds: must be between"),
    ({"profile": "vllm-planner", "maxBatch": "NaN"}, "maxBatch: 'NaN' is not a number"),
    ({"profile": "vllm-planner", "metricType": "Value"}, "use AverageValue"),
    ({"profile": "vllm-planner", "signal": "vllm-waiting"}, "only signal"),
    ({"profile": "vllm-inference", "signal": "planned-replicas", "targetValue": "1"},
     "only signal"),
])
def test_planner_keys_refused(md: dict[str, str], message: str) -> None:
    with pytest.raises(MetadataError, match=message):
        parse_metadata(md)


def test_the_planners_keys_in_its_docs_are_the_keys_it_takes_with_their_defaults() -> None:
    """docs/planner.md's table of keys: every key the trigger takes, none it does not, and
    each numeric default as parsed."""
    from pathlib import Path

    from gpuscale.scaler.core.trigger import PLANNER_KEYS

    docs = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    table = docs[docs.index("| key | what | default |"):]
    rows = [line.split("|") for line in table.splitlines()[2:] if line.startswith("| `")]
    documented = {row[1].strip().strip("`"): row[3].strip() for row in rows}
    assert set(documented) == PLANNER_KEYS
    parsed = parse_metadata({"profile": "vllm-planner"}).planner
    assert parsed is not None
    attributes = {"ttftSeconds": parsed.ttft_s, "prefillTokensPerSecond": parsed.prefill_tps,
                  "decodeTokensPerSecond": parsed.decode_tps, "maxBatch": parsed.max_batch,
                  "utilization": parsed.utilization, "memorySeconds": parsed.memory_s,
                  "drainSeconds": parsed.drain_s, "promptTokens": parsed.prompt_tokens,
                  "spareReplicas": parsed.spare_replicas}
    for key, value in attributes.items():
        assert float(documented[key]) == value, key


def test_the_parse_cache_keeps_real_triggers_not_huge_maps() -> None:
    """Every trigger KEDA asks about is parsed once (three calls a chain), but a map larger
    than any real trigger's is parsed each time, not kept: the cache's memory is bounded
    by the small ones."""
    from gpuscale.scaler.core.trigger import CACHED_TOTAL, _parse

    small = {"podSelector": "app=cache-test-small"}
    parse_metadata(small)
    hits = _parse.cache_info().hits
    assert parse_metadata(small) == parse_metadata(small)
    assert _parse.cache_info().hits == hits + 2
    values = ",".join(f"value-{i}" for i in range(400))
    big = {"podSelector": f"app in ({values})"}
    assert len(big["podSelector"]) > CACHED_TOTAL
    size = _parse.cache_info().currsize
    first, again = parse_metadata(big), parse_metadata(big)
    assert first == again
    assert first is not again  # parsed each time
    assert _parse.cache_info().currsize == size
