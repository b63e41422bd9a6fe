"""Every flag a remediation names exists in the engine/router versions documented in
/work/shared/reference (copied here, with the section each came from; the test never reads
../shared at run time)."""

from __future__ import annotations

import re

from test_findings_rules import (
    SG,
    VL,
    VL2,
    Fleet,
    build,
    findings_by_rule,
    itl_fleet,
    settings,
    two_turn_sessions,
)

# reference/sglang.md §2 "Server args that matter for agent workloads" (SGLang f7101b0ae6 / v0.5.18)
SGLANG_FLAGS = {
    "--enable-hierarchical-cache", "--hicache-ratio", "--hicache-size", "--hicache-write-policy",
    "--schedule-policy", "--enable-priority-scheduling", "--disable-radix-cache", "--radix-eviction-policy",
    "--chunked-prefill-size", "--max-prefill-tokens", "--page-size", "--mem-fraction-static",
    "--max-running-requests", "--enable-cache-report", "--disaggregation-mode", "--enable-metrics",
}
# reference/vllm.md §3 (cache fields), §5.1 (prefix caching), §5.3 (KV offloading), §6 (preemption),
# §4.1 (--kv-transfer-config for connectors / P/D) — vLLM v1 at 52a31cc / 43d691e (2026-05/08)
VLLM_FLAGS = {
    "--enable-prompt-tokens-details", "--no-enable-prefix-caching", "--kv-offloading-size",
    "--kv-offloading-backend", "--scheduling-policy", "--kv-transfer-config", "--kv-events-config",
}
# reference/gateway-otel.md §3.3 (vLLM production-stack router), §3.4 (vLLM Router)
ROUTER_FLAGS = {"--routing-logic", "--session-key", "--policy"}
VALID = SGLANG_FLAGS | VLLM_FLAGS | ROUTER_FLAGS

# values the remediations put after a flag, per flag (same sections)
VALUES = {
    "--schedule-policy": {"lpm", "fcfs", "lof"},       # sglang.md §2 choices
    "--hicache-write-policy": {"write_through", "write_back", "write_through_selective"},
    "--kv-offloading-backend": {"native", "lmcache"},  # vllm.md §5.3
    "--scheduling-policy": {"priority"},               # vllm.md §6
    "--policy": {"consistent_hash", "cache_aware"},    # gateway-otel.md §3.4
    "--routing-logic": {"session"},                    # gateway-otel.md §3.3
    "--disaggregation-mode": {"prefill", "decode"},
}
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?:[ =]([A-Za-z_][\w-]*))?")


def flags_in(text: str) -> list[tuple[str, str | None]]:
    return FLAG.findall(text)


def test_flag_regex_sees_flags_and_values():
    assert flags_in("`--schedule-policy lpm` and `--hicache-ratio 3`") == [("--schedule-policy", "lpm"),
                                                                             ("--hicache-ratio", "")]


def check_remediation(text: str) -> set[str]:
    seen = set()
    for flag, value in flags_in(text):
        assert flag in VALID, f"remediation names {flag!r}, which reference/ does not document: {text}"
        if flag in VALUES and value:
            assert value in VALUES[flag], f"{flag} {value!r} is not a documented choice"
        seen.add(flag)
    return seen


def test_every_remediation_names_documented_flags(store, tmp_path):
    # one dataset that makes nearly every rule fire at once
    calls = (two_turn_sessions(SG) + two_turn_sessions(VL, instance2=VL2, start=500.0)
             + two_turn_sessions("10.0.0.4:8000", start=900.0) + two_turn_sessions("10.0.0.6:8000", start=1700.0)
             + itl_fleet().calls)
    for c in two_turn_sessions("10.0.0.5:8000", start=1300.0):
        c.C, c.session = None, None
        calls.append(c)
    fleet = Fleet(calls, sglang={SG: {"schedule_policy": "fcfs"}},
                  vllm={VL: {}, VL2: {}, "10.0.0.4:8000": {"enable_prefix_caching": "False"},
                        "10.0.0.5:8000": {}, "10.0.0.6:8000": {}},
                  queue={SG: [(0.0, 0.0), (150.0, 5.0), (400.0, 0.0)]},
                  # the retractions inside session a's gap make its 16,000-token miss an eviction before the queue
                  # builds (at 150 s), which hicache_off owns: the SG two-turn misses (queued) go to sglang_fcfs first
                  preemptions=itl_fleet().preemptions)
    build(store, tmp_path, fleet)
    by_rule, found = findings_by_rule(store[0], settings=settings(findings_no_session_share=0.1))  # 20 of 106 calls
    assert {"hicache_off", "sglang_fcfs", "prefix_cache_off", "non_affine_routing", "vllm_no_offload",
            "itl_long_prefill", "obs_cached_tokens", "obs_session_id"} <= set(by_rule)
    named = set()
    for f in found:
        named |= check_remediation(f.remediation)
    # the flags the issue asks for are among them, spelled exactly
    assert {"--enable-hierarchical-cache", "--hicache-ratio", "--hicache-write-policy", "--schedule-policy",
            "--no-enable-prefix-caching", "--kv-offloading-size", "--enable-prompt-tokens-details",
            "--chunked-prefill-size", "--policy"} <= named


def test_rule_docstrings_name_only_documented_flags():
    from agentobs.findings.rules import RULES

    for rule in RULES:
        assert rule.__doc__ and "Trigger" in rule.__doc__ and "Fix" in rule.__doc__, rule.__name__
        check_remediation(rule.__doc__)
