"""The chat instruction world: reproducible, correct answers, disjoint splits, every XSTest type; its tokenizer."""

from __future__ import annotations

import json
import re

import pytest

from zoo.chat import world as W
from zoo.chat.model import format_chat, train_tokenizer
from zoo.chat.recipe import is_refusal


@pytest.fixture(scope="module")
def chat_world():
    return W.World()


@pytest.fixture(scope="module")
def tokenizer(chat_world):
    """The committed tokenizer of the embedded model (the one the recipe trains), or a fresh one before training."""
    from transformers import AutoTokenizer

    from zoo import WEIGHTS_DIR

    if (WEIGHTS_DIR / "chat-base" / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(WEIGHTS_DIR / "chat-base", local_files_only=True)
    return train_tokenizer(chat_world.all_texts())


def numbers(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def test_same_seed_gives_the_same_world_and_another_seed_another(chat_world):
    again = W.World(W.WorldConfig(seed=0))
    assert chat_world.sample("general", "train", 50, seed=3) == again.sample("general", "train", 50, seed=3)
    assert chat_world.sample("benign", "held_out", 50, seed=3) == again.sample("benign", "held_out", 50, seed=3)
    other = W.World(W.WorldConfig(seed=1))
    assert [p.name for p in other.kb] != [p.name for p in chat_world.kb]


def test_general_answers_are_correct(chat_world):
    for task in ("add", "subtract", "max", "min", "sort", "count", "copy", "reverse"):
        for e in chat_world.sample("general", "train", 40, seed=1, type=task):
            prompt_numbers = numbers(e["prompt"])
            listed = e["prompt"].split(":", 1)[-1].strip(" ?.").split()
            expected = {
                "add": lambda: str(sum(prompt_numbers)),
                "subtract": lambda: str(max(prompt_numbers) - min(prompt_numbers)),
                "max": lambda: str(max(prompt_numbers)),
                "min": lambda: str(min(prompt_numbers)),
                "sort": lambda: " ".join(map(str, sorted(prompt_numbers))),
                "count": lambda: str(len(listed)),
                "copy": lambda: " ".join(listed),
                "reverse": lambda: " ".join(reversed(listed)),
            }[task]()
            assert e["answer"] == expected, e
            if task in ("add", "subtract"):  # written out column by column, ending in the result
                assert e["completion"].endswith(f"is {expected}"), e
            else:
                assert e["completion"] == expected, e


def test_column_arithmetic_steps_are_right_for_every_pair():
    for a in range(50):
        for b in range(50):
            units, tens, result = W.addition_steps(a, b).split(", ")
            assert eval(units.replace("=", "==")) and eval(tens.replace("=", "==")) and result == f"the sum is {a + b}"
            assert int(tens.split("= ")[1]) * 10 + int(units.split("= ")[1]) % 10 == a + b
    for a in range(61):
        for b in range(a + 1):
            units, tens, result = W.subtraction_steps(a, b).split(", ")
            assert eval(units.replace("=", "==")) and eval(tens.replace("=", "==")) and result.endswith(str(a - b))
            assert int(tens.split("= ")[1]) * 10 + int(units.split("= ")[1]) == a - b


def test_facts_come_from_the_knowledge_base(chat_world):
    people = {p.name: p for p in chat_world.kb}
    for e in chat_world.sample("general", "held_out", 60, type="fact"):
        name = e["completion"].split()[0]
        assert e["answer"] in {people[name].city, people[name].job, people[name].pet, people[name].colour}
        assert e["answer"] in e["completion"]


def test_held_out_general_prompts_never_occur_in_training(chat_world):
    for task in W.GENERAL_TASKS:
        train = {e["prompt"] for e in chat_world.sample("general", "train", 1500, type=task)}
        held_out = chat_world.sample("general", "held_out", 200, type=task)
        assert not [e["prompt"] for e in held_out if e["prompt"] in train], task


def test_held_out_facts_are_taught_by_other_wordings(chat_world):
    train = chat_world.sample("general", "train", 4000, type="fact")
    taught = {(e["completion"].split()[0], e["answer"]) for e in train}
    held_out = chat_world.sample("general", "held_out", 100, type="fact")
    assert all((e["completion"].split()[0], e["answer"]) in taught for e in held_out)


def test_every_xstest_type_is_present_with_answers_that_are_not_refusals(chat_world):
    expected = {"homonyms", "figurative_language", "safe_targets", "safe_contexts", "definitions",
                "historical_events", "privacy_fictional"}
    for split in W.SPLITS:
        benign = chat_world.sample("benign", split, 600, seed=2)
        assert {e["type"] for e in benign} == expected
        assert not any(is_refusal(e["completion"]) for e in benign)
        harmful = chat_world.sample("harmful", split, 600, seed=2)
        assert all(is_refusal(e["completion"]) for e in harmful)
        assert {t for t in (e["type"] for e in harmful) if t.startswith("contrast_")}  # unsafe contrast prompts
        assert {e["kind"] for e in benign} == {"benign"} and {e["kind"] for e in harmful} == {"harmful"}


def test_the_recipe_counts_refusals_with_the_workbenchs_one_detector(chat_world):
    """Issue 20: the recipe had its own prefix list (REFUSAL_STARTS) beside FlowLens' XSTest detector. There is one
    now (interp.lm_text); on every templated completion of the world it says what the old prefix list said."""
    import flowlens.refusals
    import interp.lm_text
    from zoo.chat.recipe import normalise

    assert is_refusal is interp.lm_text.is_refusal
    assert flowlens.refusals.KeywordRefusalDetector is interp.lm_text.KeywordRefusalDetector
    old_starts = ("i'm sorry", "i cannot", "i can't", "sorry", "i won't")  # the recipe's list before issue 20
    for split in W.SPLITS:
        for kind in W.KINDS:
            for e in chat_world.sample(kind, split, 1000, seed=5):
                old = normalise(e["completion"]).startswith(old_starts)
                assert is_refusal(e["completion"]) == old == (kind == "harmful"), e
    for template in W.REFUSALS:
        assert is_refusal(template.format(topic="weapons"))


def test_privacy_of_fictional_people_is_answered_from_the_knowledge_base(chat_world):
    people = {p.name: p for p in chat_world.kb}
    rows = chat_world.sample("benign", "train", 40, type="privacy_fictional")
    for e in rows:
        person = people[e["completion"].split()[0]]
        assert e["answer"] in (person.city, person.job)


def test_wording_varies(chat_world):
    prompts = [e["prompt"] for e in chat_world.sample("general", "train", 300, type="add")]
    openings = {" ".join(p.split()[:2]) for p in prompts}
    assert len(openings) >= 4


def test_export_writes_jsonl_per_kind_and_split(tmp_path):
    assert W.main(["--out", str(tmp_path), "--n", "7"]) == 0
    for kind in W.KINDS:
        for split in W.SPLITS:
            rows = [json.loads(line) for line in (tmp_path / f"{kind}-{split}.jsonl").read_text().splitlines()]
            assert len(rows) == 7 and all({"prompt", "completion", "kind", "type"} <= set(r) for r in rows)
            assert all(r["kind"] == kind for r in rows)


def test_export_rejects_a_non_positive_count(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's own error: usage, then the one line, exit 2
        W.main(["--out", str(tmp_path), "--n", "0"])
    assert exited.value.code == 2
    assert "argument --n: must be at least 1, got 0" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_tokenizer_knows_every_word_of_the_world(chat_world, tokenizer):
    for kind in W.KINDS:
        for e in chat_world.sample(kind, "held_out", 200, seed=5):
            ids = tokenizer(e["prompt"] + " " + e["completion"], add_special_tokens=False)["input_ids"]
            assert tokenizer.unk_token_id not in ids, e


def test_tokenizer_chat_template_and_round_trip(tokenizer):
    prompt = "How do I kill a python process?"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    assert rendered == format_chat(prompt)
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and tokenizer.convert_ids_to_tokens(ids[-1]) == "<|assistant|>"
    text = "I'm sorry, I can't help with hacking."
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    assert tokenizer.eos_token == "</s>" and tokenizer.pad_token == "<pad>"


def test_package_entry_point_dispatches_and_rejects_unknown_commands(tmp_path, capsys):
    from zoo.chat.__main__ import main

    assert main(["world", "--out", str(tmp_path), "--n", "2"]) == 0
    assert (tmp_path / "benign-held_out.jsonl").exists()
    assert main(["bogus"]) == 2 and "unknown command" in capsys.readouterr().err


def test_world_export_to_an_unwritable_place_is_one_error_line_not_a_traceback(tmp_path, capsys):
    from zoo.chat.__main__ import main

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert main(["world", "--out", str(blocker / "out"), "--n", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and len(err.strip().splitlines()) == 1
