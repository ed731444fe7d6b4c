"""How the report shows its figures to people: latencies in ms under '(ms)' headers, sample counts
and 'too few' for small buckets, times to the second, whole-minute ticks on short days, the load
curve sorted, the run config collapsed with its TOML as text, and every value escaped by the
template engine (jinja2, autoescape). No engine needed: these build the page from values."""

from __future__ import annotations

import re
from typing import Any

from pipeline.publish.report import (
    TRAFFIC_HEADROOM,
    _health_cards,
    _html_table,
    config_tomls,
    latency_bucket_table,
    latency_table,
    load_curve_table,
    render_html,
    time_axis,
    to_second,
)

EVIL = "<img src=x onerror=alert(1)>"


def _cells(page: str) -> list[list[str]]:
    rows = re.findall(r"<tr>(.*?)</tr>", page.replace("\u200b", ""), re.S)
    return [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row) for row in rows]


def test_latency_table_is_in_ms_with_n_min_max_std_and_too_few() -> None:
    rows = [
        {
            "metric": "ttft_s",
            "samples": 250,
            "p50": 0.0971,
            "p90": 0.2,
            "p95": 0.25,
            "p99": 1.23456,
            "p99_9": 2.0,
            "mean": 0.12,
            "min": 0.0123,
            "max": 2.5,
            "std": 0.0456,
        },
        {
            "metric": "tpot_s",
            "samples": 5,
            "p50": 0.00971,
            "p90": 0.01,
            "p95": 0.011,
            "p99": 0.012,
            "p99_9": 0.013,
            "mean": 0.0099,
            "min": 0.009,
            "max": 0.013,
            "std": 0.001,
        },
    ]
    head, ttft, tpot = _cells(latency_table(rows))
    assert head == ["metric", "n", "min (ms)", "p50 (ms)", "p90 (ms)", "p95 (ms)", "p99 (ms)", "p99.9 (ms)",
                    "max (ms)", "mean (ms)", "std (ms)"]  # fmt: skip
    # 3 significant digits, thousands separators from 100 ms up, never a unit under an (ms) header
    assert ttft == ["ttft", "250", "12.3", "97.1", "200", "250", "1,235", "too few (n &lt; 1,000)", "2,500",
                    "120", "45.6"]  # fmt: skip
    # 5 requests: p50 is shown, the tail percentiles are not (they would be the maximum)
    assert tpot[:4] == ["tpot", "5", "9", "9.71"]
    assert tpot[4:7] == ["too few (n &lt; 10)", "too few (n &lt; 20)", "too few (n &lt; 100)"]
    assert not any(c.endswith(" s") or "(s)" in c for row in (head, ttft, tpot) for c in row)


def test_numbers_are_right_aligned_and_headers_break_after_underscores() -> None:
    page = str(_html_table([{"usd_per_million_output_tokens": 17.1, "hardware": "h100-sxm", "tokens": "20,051,456"}]))
    assert "<th>usd_\u200bper_\u200bmillion_\u200boutput_\u200btokens</th>" in page
    assert '<td class="num">17.1</td><td>h100-sxm</td><td class="num">20,051,456</td>' in page


def test_prompt_buckets_show_their_count_and_say_when_too_small() -> None:
    rows = [
        {"bucket": "0-511", "metric": "ttft_s", "samples": 1200, "p50": 0.05, "p90": 0.08, "p99": 0.3, "mean": 0.06},
        {"bucket": "32768+", "metric": "ttft_s", "samples": 3, "p50": 1.5, "p90": 1.5, "p99": 1.5, "mean": 1.4},
    ]
    head, big, small = _cells(latency_bucket_table(rows))
    assert head == ["bucket", "metric", "n", "p50 (ms)", "p90 (ms)", "p99 (ms)", "mean (ms)"]
    assert big == ["0-511", "ttft", "1,200", "50", "80", "300", "60"]
    assert small == ["32768+", "ttft", "3", "1,500", "too few (n &lt; 10)", "too few (n &lt; 100)", "1,400"]


def test_peak_times_are_rounded_to_the_second_in_utc() -> None:
    assert to_second("2025-01-15T00:13:05.123456") == "2025-01-15 00:13:05"
    assert to_second("2025-01-15T00:13:05.5") == "2025-01-15 00:13:06"
    assert to_second("2025-01-15T01:13:05.999999+01:00") == "2025-01-15 00:13:06"
    assert to_second(None) is None and to_second("n/a") == "n/a"


def test_time_axis_ticks_on_whole_minutes_on_a_short_day_and_hours_on_a_long_one() -> None:
    from datetime import UTC, datetime

    def ticks(first: str, last: str) -> tuple[str, list[str]]:
        axis = time_axis([{"t": first}, {"t": last}], "t").to_dict()
        return axis["format"], [datetime.fromtimestamp(v / 1000, UTC).strftime("%d %H:%M") for v in axis["values"]]

    # a 10-minute day: one tick a minute, each label once (Vega's default put two ticks in a minute)
    fmt, ten = ticks("2025-01-15T00:00:20", "2025-01-15T00:09:50")
    assert fmt == "%H:%M" and ten == [f"15 00:0{m}" for m in range(1, 10)]
    assert ticks("2025-01-15T00:00:00", "2025-01-15T01:08:00")[1] == [f"15 0{h}:{m}0" for h in (0, 1)
                                                                      for m in range(6)][:7]  # fmt: skip
    fmt, day = ticks("2025-01-15T00:00:00", "2025-01-15T23:59:00")
    assert fmt == "%H:%M" and day == [f"15 {h:02d}:00" for h in range(0, 24, 2)]
    fmt, week = ticks("2025-01-15T00:00:00", "2025-01-21T00:00:00")
    assert fmt == "%b %d %H:%M" and len(week) == 13 and week[1] == "15 12:00"
    assert time_axis([], "t").to_dict() == {"format": "%H:%M", "labelOverlap": True}


def test_load_curve_table_is_sorted_by_multiplier_in_ms() -> None:
    def point(m: float, ttft: float) -> dict[str, Any]:
        return {"multiplier": m, "status": "ok", "requests": 100, "finished": 100, "rejected": 0,
                "ttft_p50_s": ttft / 2, "ttft_p99_s": ttft, "tpot_p50_s": 0.01, "tpot_p99_s": 0.02,
                "slo": "chat", "slo_passed": m < 3, "overloaded": False}  # fmt: skip

    rows = [point(1, 0.2), point(1.5, 0.3), point(2, 0.4), point(3, 3.0), point(4, 9.0), point(0.5, 0.1)]
    head, *body = _cells(load_curve_table(rows))
    assert [r[0] for r in body] == ["0.5×", "1×", "1.5×", "2×", "3×", "4×"]
    assert head[5:9] == ["ttft_p50 (ms)", "ttft_p99 (ms)", "tpot_p50 (ms)", "tpot_p99 (ms)"]
    assert body[-1][6] == "9,000" and body[-1][9] == "chat FAIL" and body[0][9] == "chat pass"


def test_headroom_is_called_traffic_headroom() -> None:
    cards = _health_cards({"headroom": "meets the SLO chat up to 2x today's traffic", "knee": 2.0})
    card = next(c for c in cards if c[0] == TRAFFIC_HEADROOM)
    assert card[1] == "2× today's load" and TRAFFIC_HEADROOM == "Traffic headroom (× today's load)"


def test_run_config_is_collapsed_and_its_toml_is_text() -> None:
    toml = '[fleet]\nname = "x"\nmodel = "llama-3.1-8b"\n'
    config = {"run_id": "r", "resolved": {"calibration_text": toml, "fleet": {"name": "x"}}, "note": "a\nb"}
    assert config_tomls(config) == [("resolved.calibration_text", toml)]
    page = render_html("t", "s", {}, [], [], "", config=config)
    section = page[page.index('<section id="run-config">') :]
    assert re.search(r'<section id="run-config"><h2>Run config</h2>\s*<details><summary>', section)
    assert "<details open" not in section
    # the TOML as preformatted lines (quotes escaped once by the template, not \\n-joined JSON)
    assert '<pre class="toml">[fleet]\nname = &#34;x&#34;\nmodel = &#34;llama-3.1-8b&#34;\n</pre>' in section


def test_values_from_logs_are_escaped_by_the_template_engine() -> None:
    h = {
        "warnings": [f"MODEL MIX: 3 of 3 requests were logged for other models ({EVIL}: 3)"],
        "hardware": EVIL,
        "gpus": 2,
        "slo": EVIL,
        "slo_passed": False,
        "verdict": {"targets": []},
    }
    page = render_html(EVIL, EVIL, h, [], [(EVIL, str(_html_table([{EVIL: EVIL}])))], "", config={"x": EVIL})
    markup = re.sub(r"<script>.*?</script>", "", page, flags=re.S)
    assert EVIL not in markup
    assert markup.count("&lt;img src=x onerror=alert(1)&gt;") >= 8
    banner = page[page.index('<div class="alert">') : page.index('<div class="cards">')]
    assert "<b>This run has failures</b>" in banner and "MODEL MIX" in banner
