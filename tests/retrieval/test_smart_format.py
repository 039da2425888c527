from pathlib import Path

from retrieval import smart_format

COLLECTION = """.I 1
.T
flow over a wedge
.A
someone
.W
the flow over a
wedge is computed .
.I 2
.T
a note
.W
short
.W
and a second part
.I 3
.T
no abstract
"""


def test_records_keep_every_field_and_join_a_repeated_one(tmp_path: Path) -> None:
    path = tmp_path / "cran.all"
    path.write_text(COLLECTION.replace("\n", "\r\n"), encoding="ascii")
    records = smart_format.records(path)
    assert [r["I"] for r in records] == ["1", "2", "3"]
    assert records[0] == {
        "I": "1",
        "T": "flow over a wedge",
        "A": "someone",
        "W": "the flow over a wedge is computed .",
    }
    assert records[1]["W"] == "short and a second part"
    assert "W" not in records[2]


def test_texts_are_the_abstracts_longer_than_the_minimum(tmp_path: Path) -> None:
    path = tmp_path / "cran.all"
    path.write_text(COLLECTION, encoding="ascii")
    assert smart_format.texts(path) == [
        "the flow over a wedge is computed .",
        "short and a second part",
    ]
    assert smart_format.texts(path, min_chars=30) == ["the flow over a wedge is computed ."]
