"""experiments.spec_decoding.across_runs: medians and ranges over repeated runs, and each run's best γ."""
import json

import pytest

from experiments.spec_decoding.across_runs import load_runs, main, markdown, summarize


def _row(gamma, speedup, decode, path="generate"):
    return {"path": path, "method": "draft_model", "temperature": 0.0, "batch": 1, "gamma": gamma,
            "speedup": speedup, "decode_speedup": decode}


def _write_runs(folder, runs):
    for i, rows in enumerate(runs, 1):
        (folder / f"run{i}").mkdir()
        best = [max(rows, key=lambda r: r["speedup"])]
        (folder / f"run{i}" / "results.json").write_text(json.dumps({"tables": {"draft_model": rows, "best": best}}))


RUNS = [[_row(5, 1.80, 2.00), _row(7, 1.95, 2.20)],
        [_row(5, 1.90, 2.10), _row(7, 1.70, 1.90)],
        [_row(5, 1.70, 1.85), _row(7, 1.85, 2.05)]]


def test_medians_ranges_and_best_gamma(tmp_path):
    _write_runs(tmp_path, RUNS)
    runs = load_runs(tmp_path)
    assert len(runs) == 3 and all(len(r) == 2 for r in runs)  # the "best" table is not read as rows
    by_gamma = {p["gamma"]: p for p in summarize(runs)}
    assert list(by_gamma) == [5, 7, "best"]
    assert by_gamma[5]["speedup"] == {"median": 1.80, "min": 1.70, "max": 1.90, "runs": 3}
    assert by_gamma[7]["decode_speedup"] == {"median": 2.05, "min": 1.90, "max": 2.20, "runs": 3}
    best = by_gamma["best"]
    assert best["best_gammas"] == [7, 5, 7]
    assert best["speedup"] == {"median": 1.90, "min": 1.85, "max": 1.95, "runs": 3}
    # the decode figure is the best-by-end-to-end row's, not the largest decode figure
    assert best["decode_speedup"]["median"] == 2.10 and best["decode_speedup"]["min"] == 2.05


def test_paths_are_separate_points(tmp_path):
    _write_runs(tmp_path, [[_row(3, 1.5, 1.6), _row(3, 1.2, 1.3, path="engine")]])
    summary = summarize(load_runs(tmp_path))
    assert {(p["path"], p["gamma"]): p["speedup"]["median"] for p in summary} == {
        ("engine", 3): 1.2, ("engine", "best"): 1.2, ("generate", 3): 1.5, ("generate", "best"): 1.5}


def test_main_writes_the_table(tmp_path, capsys):
    _write_runs(tmp_path, RUNS)
    main([str(tmp_path)])
    text = (tmp_path / "ACROSS_RUNS.md").read_text()
    assert text == capsys.readouterr().out == markdown(summarize(load_runs(tmp_path)))
    assert "| generate | draft_model | 0 | 1 | best: 7, 5, 7 | 3 | 1.90x (1.85-1.95) | 2.10x (2.05-2.20) |" in text


def test_empty_folder_is_an_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match=str(tmp_path)):
        load_runs(tmp_path)
