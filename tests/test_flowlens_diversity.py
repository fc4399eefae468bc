"""Lexical diversity measures against values computed by hand on small texts."""

from __future__ import annotations

import json
import math

import pytest

from flowlens.__main__ import main
from flowlens.diversity import DataError, lexical_diversity, msttr, read_texts, word_tokenize


def test_measures_match_hand_computed_values():
    # tokens: [a b a] [b c]; unigrams a:2 b:2 c:1; bigrams ab, ba, bc (none crosses the two texts)
    report = lexical_diversity(["a b a", "B c"])
    h1 = -(2 * 0.4 * math.log2(0.4) + 0.2 * math.log2(0.2))
    assert report.n_tokens == 5
    assert report.entropy[1] == pytest.approx(h1)
    assert report.entropy[2] == pytest.approx(math.log2(3))
    assert report.entropy[3] == pytest.approx(0.0)
    assert report.distinct[1] == pytest.approx(3 / 5)
    assert report.unique[1] == pytest.approx(1 / 5)
    assert report.distinct[2] == pytest.approx(1.0)  # 0.75 if n-grams crossed texts
    assert report.unique[2] == pytest.approx(1.0)
    assert report.msttr is None  # fewer than 50 tokens: no full window


def test_repetitive_text_has_lower_entropy_and_distinct_n():
    refusal = ["I'm sorry, but I can't help with that."] * 20
    varied = [f"The answer to question {i} is {i * 7} because {i} times seven is {i * 7}." for i in range(20)]
    low, high = lexical_diversity(refusal), lexical_diversity(varied)
    assert low.entropy[1] < high.entropy[1] and low.distinct[2] < high.distinct[2]
    assert low.distinct[2] == pytest.approx(len(set(zip(word_tokenize(refusal[0]), word_tokenize(refusal[0])[1:])))
                                            / (20 * (len(word_tokenize(refusal[0])) - 1)))


def test_msttr_averages_full_windows_and_drops_the_rest():
    tokens = ["x"] * 50 + [f"w{i}" for i in range(50)] + ["y"] * 10
    assert msttr(tokens, 50) == pytest.approx((1 / 50 + 1.0) / 2)
    assert msttr(list("abab"), 3) == pytest.approx(2 / 3)


def test_word_tokenizer_keeps_contractions_and_splits_punctuation():
    assert word_tokenize("I’m sorry, I CAN'T.") == ["i'm", "sorry", ",", "i", "can't", "."]


def test_hugging_face_tokenizer_counts_its_own_tokens():
    from flowlens.diversity import hf_tokenizer_function
    from flowlens.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer(["a b c"])
    report = lexical_diversity(["a b a", "b c"], hf_tokenizer_function(tokenizer), tokenizer_name="tiny")
    assert report.n_tokens == 5 and report.distinct[1] == pytest.approx(3 / 5)


def test_jsonl_fields_aliases_and_missing_field_named_by_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "p1", "completion": "c1"}\n\n{"instruction": "p2", "output": "c2"}\n'
                    '{"query": "p3"}\n')
    assert read_texts(path, "queries") == ["p1", "p2", "p3"]
    with pytest.raises(DataError, match="line 4 has no completion"):
        read_texts(path, "completions")
    path.write_text('{"prompt": "p1", "response": "c1"}\n')
    assert read_texts(path, "both") == ["p1", "c1"]
    path.write_text("")
    with pytest.raises(DataError, match="empty"):
        read_texts(path)


def test_cli_prints_table_and_writes_json(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": "q", "completion": "a b a"}) for _ in range(3)) + "\n")
    out = tmp_path / "div.json"
    assert main(["diversity", str(data), "--out", str(out)]) == 0
    assert "distinct-2" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["distinct"]["distinct-1"] == pytest.approx(2 / 9) and result["n_texts"] == 3
    data.write_text('{"prompt": "q"}\n')
    assert main(["diversity", str(data), "--out", str(out)]) == 2
    assert "line 1" in capsys.readouterr().err
