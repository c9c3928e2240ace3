"""The speed report renders its tables and plots from measured figures (benchmarks/report.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import report  # noqa: E402

FIGURES = {
    "machine": report.machine(),
    "assembly": [
        {"turns": 10_000, "facts": 2_000, "mode": "plain", "p50_ms": 5.0, "p95_ms": 6.0, "p99_ms": 8.0, "tokens": 10_700},
        {"turns": 10_000, "facts": 2_000, "mode": "embedded", "p50_ms": 20.0, "p95_ms": 30.0, "p99_ms": 40.0, "tokens": 10_200},
    ],
    "embedding": {"texts": 256, "texts_per_s_batch_32": 120.0, "texts_per_s_batch_64": 118.0},
    "pipeline": {"turns": 1451, "embedding": "fastembed", "rebuild_s": 40.2, "rebuild_new_calls": 0, "assets": [
        {"asset": "turns_fts", "wall_s": 0.6, "llm_s": 0.0, "rows": 1451, "llm_calls": 0, "prompt_tokens": 0,
         "turns_per_s": 2300.0, "turns_per_s_excl_llm": 2300.0},
        {"asset": "facts", "wall_s": 3.9, "llm_s": 0.6, "rows": 993, "llm_calls": 145, "prompt_tokens": 180_000,
         "turns_per_s": 375.0, "turns_per_s_excl_llm": 440.0},
    ]},
    "freshness": {"ready_s": [6.4, 6.9, 7.1], "ready_median_s": 6.9, "idle_rss_mib": 737, "idle_processes": 6,
                  "stop_s": [3.0], "freshness_s": [16.5, 9.0, 7.4], "freshness_p50_s": 9.0, "freshness_p95_s": 16.5},
}


def test_markdown_quotes_every_part():
    text = report.markdown(FIGURES)
    assert f"{FIGURES['machine']['cores']} cores" in text
    assert "| 10,000 | 2,000 | MiniLM | 20.0 | 30.0 | 40.0 | 10200 |" in text
    assert "120.0 texts/s at batch 32" in text
    assert "| facts | 3.9 | 0.6 | 993 | 375.0 | 440.0 | 145 |" in text
    assert "**40.2 s**" in text and "median **6.9 s**" in text and "p95 **16.5 s**" in text


def test_plots_are_written_as_png(tmp_path):
    written = report.plots(FIGURES, tmp_path)
    assert sorted(p.name for p in written) == ["assembly.png", "freshness.png", "pipeline.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000


def test_unknown_part_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["report.py", "--parts", "assembly,speed"])
    try:
        report.main()
    except SystemExit as exc:
        assert "unknown part(s) ['speed']" in str(exc.code)
    else:
        raise AssertionError("an unknown part must be refused")


def test_from_json_re_renders_without_measuring(tmp_path, monkeypatch):
    import json

    saved = tmp_path / "speed.json"
    saved.write_text(json.dumps(FIGURES))
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["report.py", "--from-json", str(saved), "--out", str(out)])
    report.main()
    assert (out / "speed.md").read_text().strip() == report.markdown(FIGURES).strip()
    assert {p.name for p in out.glob("*.png")} == {"assembly.png", "pipeline.png", "freshness.png"}


def test_markdown_quotes_the_scaling_table():
    scale = [{"familiars": 10, "messages_per_s": 5.0, "freshness_p50_s": 41.7, "freshness_p95_s": 72.4,
              "backlog_messages": 3, "runs": 16, "busy_cpu_s_per_1000_turns": 836, "peak_rss_mib": 2100,
              "load_average_1m_at_end": 1.6, "phases": {"start (spawn, imports, load)": {"median_s": 2.4, "n": 16}}}]
    text = report.markdown({**FIGURES, "scale": scale})
    assert "| 10 | 5.0 | 41.7 / 72.4 | 3 | 16 | 836 | 2100 | 2.4 | 1.6 |" in text
