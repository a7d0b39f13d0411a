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
