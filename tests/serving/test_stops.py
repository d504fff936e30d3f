from __future__ import annotations

from kairos.serving.stops import StopMatcher


def test_a_stop_split_across_pieces_ends_the_text_before_it() -> None:
    m = StopMatcher(("END",))
    sent = [m.feed(p) for p in ["ab", "cE", "N", "Dxyz"]]
    assert sent == [("ab", False), ("c", False), ("", False), ("", True)]
    assert m.text == "abc"


def test_a_held_prefix_that_does_not_complete_is_sent_later() -> None:
    m = StopMatcher(("END",))
    assert m.feed("xE") == ("x", False)
    assert m.feed("Q") == ("EQ", False)
    assert m.feed("EN") == ("", False)
    assert m.flush() == "EN"
    assert m.text == "xEQEN"


def test_the_earliest_of_several_stops_wins() -> None:
    m = StopMatcher(("\n\n", "b"))
    assert m.feed("a\n\nb") == ("a", True)


def test_without_stops_everything_passes_through() -> None:
    m = StopMatcher(())
    assert m.feed("a\n") == ("a\n", False)
    assert m.flush() == ""
