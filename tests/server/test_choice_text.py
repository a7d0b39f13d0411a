"""Stop strings over streamed tokens (host only): never shown, even in part; cut where they start."""
import pytest

from jaxserve.server.choice_text import ChoiceText
from jaxserve.tokenizer import load_tokenizer
from jaxserve.zoo import ZOO_DIR

pytestmark = pytest.mark.xdist_group("server")
TEXT = "def foo(bar):\n    return bar + 1\n"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(ZOO_DIR / "tiny-code")


@pytest.mark.parametrize("stop, expected", [(["(bar)"], "def foo"), (["rn b", "zzz"], "def foo(bar):\n    retu"),
                                            (["\n"], "def foo(bar):"), ([], TEXT), (["absent"], TEXT)])
def test_stop_strings(tok, stop, expected):
    ids = tok.encode(TEXT)
    c = ChoiceText(tok, stop)
    shown = ""
    for t in ids:
        shown += c.push(t)
        assert expected.startswith(shown)  # no part of a stop string ever streamed
    shown += c.close()
    assert shown == c.text == expected
    assert c.stopped == (expected != TEXT)
    assert len(ids) > 3 and (not c.stopped or len(c.token_ids) < len(ids))  # tokens after the stop are ignored


@pytest.mark.parametrize("stop", [["rn b"], ["\n"], []])
def test_release_hands_out_each_token_once_never_ahead_of_its_text(tok, stop):
    ids = tok.encode(TEXT)
    c = ChoiceText(tok, stop)
    released, shown = [], ""
    for t in ids:
        shown += c.push(t)
        released += list(c.release())
        if not c.stopped:  # the released tokens' own text is all shown
            assert shown.startswith(tok.decode(c.token_ids[:len(released)]))
    c.close()
    released += list(c.release())
    assert released == list(range(len(c.token_ids)))
    assert list(c.release()) == []
