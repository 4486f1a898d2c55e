"""Incremental detokenization: whole UTF-8 characters only, stop strings never leak."""
from stackd.engine.core import TextStream


def feed(stream, pieces):
    return [stream.push(p) for p in pieces]


def test_plain_text_passes_through():
    s = TextStream()
    assert feed(s, [b"Hello", b" world"]) == [b"Hello", b" world"]
    assert s.flush() == b""


def test_split_multibyte_character_is_held_until_whole():
    euro = "€".encode()                      # 3 bytes
    s = TextStream()
    assert feed(s, [b"a" + euro[:1], euro[1:2], euro[2:] + b"b"]) == [b"a", b"", euro + b"b"]


def test_stop_string_ends_the_text_before_it():
    s = TextStream(["END"])
    out = feed(s, [b"one two E", b"N", b"D three"])
    assert b"".join(out) == b"one two " and s.stopped and s.matched == "END"
    assert s.push(b"more") == b"" and s.flush() == b""


def test_the_earliest_stop_in_the_text_is_the_one_matched():
    s = TextStream(["three", "two", "one two"])
    assert s.push(b"zero one two three") == b"zero " and s.matched == "one two"
    tie = TextStream(["ab", "abc"])                     # same place: the first listed
    assert tie.push(b"xabc") == b"x" and tie.matched == "ab"
    assert TextStream(["x"]).matched is None


def test_partial_match_is_held_back_not_retracted():
    s = TextStream(["</answer>"])
    assert s.push(b"42 </ans") == b"42 "
    assert s.push(b"wer") == b""
    assert s.push(b"X") == b"</answerX"      # it was not the stop string after all
    assert not s.stopped


def test_held_back_text_is_released_at_the_end():
    s = TextStream(["STOP"])
    assert s.push(b"almost ST") == b"almost "
    assert s.flush() == b"ST"


def test_earliest_of_several_stops_wins():
    s = TextStream(["b", "cd"])
    assert b"".join(feed(s, [b"acdb"])) == b"a" and s.stopped


def test_stop_made_of_multibyte_characters():
    stop = "終わり"
    data = ("前" + stop + "後").encode()
    s = TextStream([stop])
    out = b"".join(s.push(data[i:i + 1]) for i in range(len(data)))
    assert out == "前".encode() and s.stopped


def test_incomplete_character_at_the_end_is_dropped():
    s = TextStream()
    assert s.push(b"x\xe2\x82") == b"x"
    assert s.flush() == b""
