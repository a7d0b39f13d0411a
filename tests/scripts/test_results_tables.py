"""benchmarks/RESULTS.md is what scripts/results_tables.py renders from the committed results.json files.

So RESULTS.md cannot drift from the results: a new run, a deleted folder or an edit by hand fails here
until ``python scripts/results_tables.py`` re-renders it. Plain json: no JAX, well under a second.
"""
import importlib.util
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("results_tables", REPO / "scripts" / "results_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_md_is_the_rendered_tables(tables):
    assert (REPO / "benchmarks" / "RESULTS.md").read_text() == tables.render(), \
        "benchmarks/RESULTS.md is stale: run python scripts/results_tables.py"
    assert tables.main(["--check"]) == 0


def test_every_committed_run_is_cited_and_every_citation_has_its_run_metadata(tables):
    cited = {rel for claim in tables.CLAIMS for rel in claim.sources}
    committed = {str(p.relative_to(REPO)) for p in (REPO / "results").rglob("results.json")
                 if "smoke" not in p.relative_to(REPO / "results").parts}
    assert committed - cited == set(), "results no table cites (superseded runs belong in git history only)"
    assert cited - committed == set()
    for rel in sorted(cited):
        meta = tables.load(rel)["meta"]
        missing = [k for k in ("command", "date", "machine", "git_commit") if not meta.get(k)]
        assert not missing, f"{rel}: meta lacks {missing}"


def test_check_mode_reports_a_stale_file(tables, tmp_path, monkeypatch):
    stale = tmp_path / "RESULTS.md"
    stale.write_text(tables.render().replace("×", "x", 1))
    monkeypatch.setattr(tables, "OUT", stale)
    monkeypatch.setattr(tables, "REPO", tmp_path)
    assert tables.main(["--check"]) == 1


def test_peer_ledger_takes_the_served_engine_and_the_peer_at_the_same_precision(tables, tmp_path, monkeypatch):
    """A run whose A/B arm (weights as stored) beat the served engine, and whose llama.cpp ran Q4_0 and F16: the
    ledger's batch-1 cell is the 8-step engine against llama.cpp F16, the 4-bit cell FP4 against Q4_0."""
    rel = "results/peer_throughput/fake/results.json"
    rows = [("jaxserve", 100.0), ("jaxserve@engine.num_scheduler_steps=8", 120.0),
            ("jaxserve@engine.weight_layout=as_stored", 500.0), ("jaxserve@engine.quantization=nvfp4", 90.0),
            ("llama.cpp@F16", 80.0), ("llama.cpp@Q4_0", 60.0)]
    run = {"meta": {"command": "compare.py --dtype bfloat16", "date": "2026-12-07 10:00 UTC",
                    "machine": "Intel(R) Xeon(R) Processor, 2 CPUs (cpu)", "git_commit": "abcdef0"},
           "tables": {"throughput": [{"model": "m", "workload": "batch1", "backend": b, "tok_s_median": v}
                                     for b, v in rows]}}
    monkeypatch.setattr(tables, "CLAIMS", (tables.Claim("A fake run", (rel,), lambda: ([], [])),))
    monkeypatch.setattr(tables, "load", lambda r: run if r == rel else pytest.fail(r))
    headers, (row,) = tables.peer_ledger()
    cells = dict(zip(headers, row))
    assert cells["batch1: jaxserve / fastest peer"] == "1.50× llama.cpp@F16"
    assert cells["batch64: jaxserve / fastest peer"] == "—"
    assert cells["batch1, 4-bit weights: jaxserve's FP4 / llama.cpp's Q4_0"] == "1.50× llama.cpp@Q4_0"
    assert cells["dtype"] == "bfloat16" and cells["machine"] == "Intel Xeon Processor, 2 CPUs"
    assert cells["run (its table says what changed)"] == "[`fake`](#a-fake-run)"
