"""The one line a trainer error message quotes from a library's exception."""

from __future__ import annotations

from trainer.oneline import first_line


def test_first_line_of_a_multi_line_message_and_the_type_name_for_an_empty_one():
    assert first_line(ValueError("\n  header of it  \nthe rest\n")) == "header of it"
    assert first_line(OSError()) == "OSError"
    assert first_line(RuntimeError("   \n")) == "RuntimeError"
