"""Tests of the RL prompt-set plugin `sanarl.datasets.diffusion_nft` and the GenEval generator `geneval_templates`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sanarl.config.dataset_plugins import builtin_plugins, check_plugin, resolve_plugin
from sanarl.config.schema import Config
from sanarl.datasets import diffusion_nft as nft
from sanarl.errors import ConfigError, DataError
from sanarl.worlds import geneval_templates as gt

PROMPTS = Path(__file__).resolve().parents[2] / "sanarl" / "data" / "datasets" / "prompts"
GENEVAL_TEST = PROMPTS / "geneval" / "test_metadata.jsonl"


def _config(**dataset: object) -> Config:
    config = Config()
    config.train.train_policy.type = "grpo"
    for key, value in dataset.items():
        setattr(config.train.train_policy.dataset, key, value)
    return config


def _test_rows() -> list[dict]:
    return [json.loads(line) for line in GENEVAL_TEST.read_text(encoding="utf-8").splitlines()]


def _error(config: Config, *, val: bool = False) -> str:
    with pytest.raises(DataError) as info:
        (nft.get_val_dataset if val else nft.get_dataset)(config)
    return str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# Shipped sets


@pytest.mark.parametrize(
    ("name", "split", "rows"),
    [("pickscore", "train", 25_432), ("pickscore", "test", 2_048), ("ocr", "test", 1_018),
     ("drawbench", "test", 1_000), ("geneval", "test", 2_212)],
)  # fmt: skip
def test_shipped_sets_load_with_their_row_counts(name: str, split: str, rows: int) -> None:
    ds = nft.get_dataset(_config(name=name, split=split))
    assert len(ds) == rows
    assert ds.source == str(
        PROMPTS / name / (f"{split}_metadata.jsonl" if name == "geneval" else f"{split}.txt")
    )
    assert all(isinstance(ds[i]["prompt"], str) and ds[i]["prompt"] for i in (0, rows // 2, rows - 1))


def test_plain_sets_have_empty_metadata_and_file_order() -> None:
    ds = nft.get_dataset(_config(name="drawbench", split="test"))
    assert ds[0] == {
        "prompt": "New York Skyline with 'Google Research Pizza Cafe' written with fireworks on the sky.",
        "metadata": {},
    }
    # the last line has no trailing newline and is still a row
    assert ds[-1]["prompt"].endswith("pizza-sized quarter.")


def test_plugin_resolves_like_the_cli_and_is_listed() -> None:
    module = resolve_plugin("sanarl.datasets.diffusion_nft")
    check_plugin(module)
    assert "sanarl.datasets.diffusion_nft" in builtin_plugins()
    assert "sanarl.datasets.geneval_templates" not in builtin_plugins()


def test_geneval_rows_keep_their_metadata() -> None:
    ds = nft.get_dataset(_config(name="geneval", split="test"))
    assert ds[0] == {
        "prompt": "a photo of two wine glasses",
        "metadata": {
            "tag": "counting",
            "include": [{"class": "wine glass", "count": 2}],
            "exclude": [{"class": "wine glass", "count": 3}],
        },
    }
    assert ds[1]["metadata"] == {
        "tag": "color_attr",
        "include": [
            {"class": "handbag", "count": 1, "color": "pink"},
            {"class": "scissors", "count": 1, "color": "black"},
        ],
    }
    rows = _test_rows()
    for i, row in enumerate(rows):  # every field but "prompt", unchanged
        assert ds[i] == {"prompt": row["prompt"], "metadata": {k: v for k, v in row.items() if k != "prompt"}}
    assert sum("exclude" in ds[i]["metadata"] for i in range(len(ds))) == 320


def test_items_hand_out_copies_of_the_metadata() -> None:
    ds = nft.get_dataset(_config(name="geneval", split="test"))
    ds[0]["metadata"]["include"][0]["count"] = 99
    assert ds[0]["metadata"]["include"][0]["count"] == 2


def test_ocr_targets_of_the_first_three_rows() -> None:
    ds = nft.get_dataset(_config(name="ocr", split="test"))
    assert [ds[i]["metadata"] for i in range(3)] == [
        {"target": "Spring Collection 2024"},
        {"target": "Step Goal Achieved"},
        {"target": "Forever Yours"},
    ]
    assert ds[0]["prompt"].startswith(
        'A high-fashion runway with a sleek, modern backdrop displaying "Spring'
    )
    assert ds.stats == {"rows_in_file": 1018, "ocr_without_target": 0}


def test_ocr_target_rule() -> None:
    rows = [
        ('a sign saying "Eat Here" in "red"', {}),  # first span only
        ("a sign with no quotes", {}),  # none -> None
        ('an empty "" span', {}),  # empty -> None
        ('a "kept" one', {"target": "given"}),  # a row's own target wins
    ]
    out, missing = nft.ocr_targets(rows)
    assert [m["target"] for _, m in out] == ["Eat Here", None, None, "given"]
    assert missing == 2
    assert [p for p, _ in out] == [p for p, _ in rows]


# ---------------------------------------------------------------------------------------------------------------
# Custom files, folders, subsets, size


def test_custom_txt_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.txt"
    path.write_text("  a red cube  \n\n\t\na blue sphere\nthree cats", encoding="utf-8")
    ds = nft.get_dataset(_config(local_dir=str(path)))
    assert [ds[i] for i in range(len(ds))] == [
        {"prompt": "a red cube", "metadata": {}},
        {"prompt": "a blue sphere", "metadata": {}},
        {"prompt": "three cats", "metadata": {}},
    ]


def test_custom_jsonl_file_keeps_other_fields_as_metadata(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"prompt": "a cat", "style": "oil", "n": 2}\n\n{"prompt": " a dog "}\n', encoding="utf-8"
    )
    ds = nft.get_dataset(_config(local_dir=str(path)))
    assert [ds[0], ds[1]] == [
        {"prompt": "a cat", "metadata": {"style": "oil", "n": 2}},
        {"prompt": "a dog", "metadata": {}},
    ]


def test_folder_split_files_and_precedence(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text("t1\nt2\n", encoding="utf-8")
    (tmp_path / "test.txt").write_text("from txt\n", encoding="utf-8")
    (tmp_path / "test_metadata.jsonl").write_text('{"prompt": "from jsonl", "k": 1}\n', encoding="utf-8")
    train = nft.get_dataset(_config(local_dir=str(tmp_path)))
    assert [train[0]["prompt"], train[1]["prompt"]] == ["t1", "t2"]
    test = nft.get_dataset(_config(local_dir=str(tmp_path), split="test"))  # the jsonl wins over the txt
    assert len(test) == 1 and test[0] == {"prompt": "from jsonl", "metadata": {"k": 1}}


def test_relative_local_dir_is_taken_from_the_current_directory(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "p.txt").write_text("x\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert nft.get_dataset(_config(local_dir="p.txt"))[0]["prompt"] == "x"


def test_name_with_local_dir_applies_the_sets_row_handling(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text('a mug printed with "Hello"\na plain mug\n', encoding="utf-8")
    ds = nft.get_dataset(_config(name="ocr", local_dir=str(tmp_path)))
    assert [ds[0]["metadata"], ds[1]["metadata"]] == [{"target": "Hello"}, {"target": None}]
    assert ds.stats["ocr_without_target"] == 1


def test_filter_nsfw_drops_whole_words_only(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("a sexy cat\nEssex county fair\na NUDE statue\na dog\nsussex\n", encoding="utf-8")
    ds = nft.get_dataset(_config(local_dir=str(path), subset="filter_nsfw"))
    assert [ds[i]["prompt"] for i in range(len(ds))] == ["Essex county fair", "a dog", "sussex"]
    assert ds.stats == {"rows_in_file": 5, "nsfw_dropped": 2}
    flags = [nft.is_nsfw(p) for p in ("Dildos!", "sex2", "a boob-tube", "pornstar")]
    assert flags == [True, False, True, False]


def test_filter_nsfw_on_pickscore_counts() -> None:
    train = nft.get_dataset(_config(name="pickscore", subset="filter_nsfw"))
    assert (len(train), train.stats["nsfw_dropped"]) == (25_432 - 79, 79)  # the numbers PROVENANCE.md quotes
    assert not any(nft.is_nsfw(p) for p, _ in train.rows)


def test_size_keeps_the_first_rows() -> None:
    ds = nft.get_dataset(_config(name="ocr", split="test", size=3))
    full = nft.get_dataset(_config(name="ocr", split="test"))
    assert len(ds) == 3 and [ds[i] for i in range(3)] == [full[i] for i in range(3)]


def test_data_dir_env_replaces_the_datasets_folder(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "prompts" / "ocr").mkdir(parents=True)
    (tmp_path / "prompts" / "ocr" / "train.txt").write_text('a cake saying "Yum"\n', encoding="utf-8")
    monkeypatch.setenv("SANARL_DATA_DIR", str(tmp_path))
    ds = nft.get_dataset(_config(name="ocr"))  # a train split that only the override has
    assert ds[0] == {"prompt": 'a cake saying "Yum"', "metadata": {"target": "Yum"}}
    assert nft.data_root() == tmp_path


def test_val_dataset_defaults_and_none() -> None:
    assert nft.get_val_dataset(Config()) is None
    config = Config()
    config.validation.dataset.name = "pickscore"  # split defaults to "test"
    val = nft.get_val_dataset(config)
    assert len(val) == 2_048 and val.source.endswith("pickscore/test.txt")


# ---------------------------------------------------------------------------------------------------------------
# Errors


def test_missing_geneval_train_split_explains_the_two_ways_out() -> None:
    msg = _error(_config(name="geneval", split="train"))
    assert "`train.train_policy.dataset.split` = 'train'" in msg
    assert "(found: test;" in msg and "not shipped" in msg
    assert '`train.train_policy.dataset.subset = "generated"`' in msg
    assert "`train.train_policy.dataset.size = N`" in msg
    assert '`train.train_policy.dataset.split = "test"`' in msg and "never falls back" in msg


def test_missing_ocr_train_split_and_val_key() -> None:
    msg = _error(_config(name="ocr"))
    assert "OCR train split is not shipped" in msg and '`train.train_policy.dataset.split = "test"`' in msg
    config = Config()
    config.validation.dataset.name = "drawbench"
    config.validation.dataset.split = "train"
    assert "`validation.dataset.split` = 'train'" in _error(config, val=True)


def test_unknown_name_lists_the_known_sets() -> None:
    msg = _error(_config(name="laion"))
    assert "`train.train_policy.dataset.name` = 'laion'" in msg
    assert "['pickscore', 'ocr', 'geneval', 'drawbench', 'dance_grpo_t2v']" in msg and "local_dir" in msg


def test_no_name_and_no_local_dir() -> None:
    msg = _error(_config())
    assert (
        "`train.train_policy.dataset.name` and `train.train_policy.dataset.local_dir` are both empty" in msg
    )


@pytest.mark.parametrize("content", ["", "\n \n\t\n"])
@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_empty_prompt_file_names_the_file(tmp_path: Path, content: str, suffix: str) -> None:
    path = tmp_path / f"empty{suffix}"
    path.write_text(content, encoding="utf-8")
    msg = _error(_config(local_dir=str(path)))
    assert f"the prompt file {str(path)!r} is empty" in msg and "local_dir" in msg


def test_empty_split_file_in_a_folder_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text("\n", encoding="utf-8")
    assert str(tmp_path / "train.txt") in _error(_config(local_dir=str(tmp_path)))


@pytest.mark.parametrize(
    ("files", "expect"),
    [
        ({"bad.jsonl": '{"prompt": "ok"}\n{"prompt": oops}\n'}, "line 2 is not valid JSON"),
        ({"bad.jsonl": '["a list"]\n'}, 'line 1 has no non-empty "prompt" string'),
        ({"bad.jsonl": '{"prompt": 3}\n'}, 'line 1 has no non-empty "prompt" string'),
        ({"bad.jsonl": '{"text": "no prompt key"}\n'}, 'line 1 has no non-empty "prompt" string'),
        ({"bad.csv": "a,b\n"}, "is neither .txt (one prompt a line) nor .jsonl"),
        ({"bad.txt": b"caf\xe9\n"}, "is not UTF-8 text"),
        ({"deep.jsonl": '{"prompt": "ok"}\n' + "[" * 100_000 + "\n"}, "line 2 is not valid JSON"),
    ],
)
def test_malformed_files(tmp_path: Path, files: dict[str, str | bytes], expect: str) -> None:
    ((name, content),) = files.items()
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    msg = _error(_config(local_dir=str(path)))
    assert expect in msg and str(path.name) in msg


def test_missing_local_dir(tmp_path: Path) -> None:
    msg = _error(_config(local_dir=str(tmp_path / "nope.txt")))
    assert "`train.train_policy.dataset.local_dir`" in msg and "does not exist" in msg


def test_geneval_files_are_checked_and_need_jsonl(tmp_path: Path) -> None:
    bad = tmp_path / "g.jsonl"
    bad.write_text(
        '{"tag": "counting", "include": [{"class": "bus", "count": 0}], "prompt": "p"}\n', encoding="utf-8"
    )
    msg = _error(_config(name="geneval", local_dir=str(bad)))
    assert "line 1 is not a valid GenEval row: include[0].count is 0, not an integer >= 1" in msg
    txt = tmp_path / "g.txt"
    txt.write_text("a photo of a bus\n", encoding="utf-8")
    assert "geneval prompts need their metadata" in _error(_config(name="geneval", local_dir=str(txt)))


def test_bad_subset_split_and_size() -> None:
    msg = _error(_config(name="drawbench", split="test", subset="generated"))
    assert "`train.train_policy.dataset.subset` = 'generated' is not available for 'drawbench'" in msg
    msg = _error(_config(name="geneval", split="test", subset="generated"))
    assert "makes a train split" in msg and "`train.train_policy.dataset.split` = 'test'" in msg
    msg = _error(_config(name="ocr", split="test", size=5000))
    assert "`train.train_policy.dataset.size` = 5000" in msg and "has only 1018 prompts" in msg
    assert "it must be >= 1" in _error(_config(name="ocr", split="test", size=0))


def test_filter_that_drops_everything(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("nsfw\nporn\n", encoding="utf-8")
    assert "dropped every prompt" in _error(_config(local_dir=str(path), subset="filter_nsfw"))


def test_sft_task_is_rejected() -> None:
    config = _config(name="pickscore")
    config.train.train_policy.type = "sft"
    with pytest.raises(ConfigError, match=r'`train\.train_policy\.type` = "sft".*diffusers_dataset'):
        nft.get_dataset(config)


def test_bad_data_dir_env(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SANARL_DATA_DIR", str(tmp_path / "missing"))
    assert "$SANARL_DATA_DIR" in _error(_config(name="pickscore"))
    monkeypatch.setenv("SANARL_DATA_DIR", str(tmp_path))  # exists, but lacks prompts/pickscore
    msg = _error(_config(name="pickscore"))
    assert str(tmp_path / "prompts" / "pickscore") in msg and "does not exist" in msg


def test_generated_needs_the_test_file(tmp_path: Path) -> None:
    msg = _error(_config(name="geneval", subset="generated", local_dir=str(tmp_path)))
    assert "has no test_metadata.jsonl" in msg


# ---------------------------------------------------------------------------------------------------------------
# GenEval generator


def test_render_reproduces_every_shipped_test_prompt() -> None:
    rows = _test_rows()
    assert [gt.render(row) for row in rows] == [row["prompt"] for row in rows]
    assert {e["class"] for r in rows for e in r["include"]} == set(gt.COCO_CLASSES)
    assert {e["color"] for r in rows for e in r["include"] if "color" in e} == set(gt.COLORS)


def test_words_by_hand() -> None:
    assert [gt.plural(c) for c in ("bus", "wine glass", "bench", "sheep", "skis", "tv")] == [
        "buses", "wine glasses", "benchs", "sheeps", "skis", "tvs",
    ]  # fmt: skip
    assert gt.with_article("orange cup") == "an orange cup" and gt.with_article("red apple") == "a red apple"
    assert [gt.pool_size(t) for t in gt.TAGS] == [80, 80 * 79, 80 * 3, 80 * 10, 80 * 79 * 4, 80 * 79 * 10 * 9]
    assert gt._digits(7, (3, 4)) == [1, 3] and gt._other(2, 2) == 3 and gt._other(2, 1) == 1


def test_row_at_by_hand() -> None:
    assert gt.row_at("counting", 0) == {
        "tag": "counting",
        "include": [{"class": "person", "count": 2}],
        "exclude": [{"class": "person", "count": 3}],
        "prompt": "a photo of two persons",
    }
    # index (1 * 79 + 0) * 4 + 3: X = bicycle, Y = the 0th class other than bicycle = person, relation "below"
    assert gt.row_at("position", 319) == {
        "tag": "position",
        "include": [
            {"class": "person", "count": 1},
            {"class": "bicycle", "count": 1, "position": ["below", 0]},
        ],
        "prompt": "a photo of a bicycle below a person",
    }
    # last index: digits (79, 78, 9, 8) -> toothbrush, hair drier; white, black
    assert (
        gt.row_at("color_attr", 568_799)["prompt"] == "a photo of a white toothbrush and a black hair drier"
    )
    assert gt.row_at("colors", 25 * 10 + 1)["prompt"] == "a photo of an orange umbrella"


def test_generator_is_deterministic_by_seed() -> None:
    a = gt.generate(300, seed=7)
    assert a == gt.generate(300, seed=7)
    assert a != gt.generate(300, seed=8)
    assert len(a) == 300 and {r["tag"] for r in a} == set(gt.TAGS)


def test_generator_excludes_the_test_prompts_and_writes_valid_rows() -> None:
    test_prompts = {row["prompt"] for row in _test_rows()}
    rows = gt.generate(3000, seed=0, excluded=test_prompts)
    assert not {r["prompt"] for r in rows} & test_prompts
    counts = {t: sum(r["tag"] == t for r in rows) for t in gt.TAGS}
    assert counts == {"single_object": 0, "two_object": 600, "counting": 600, "colors": 600, "position": 600,
                      "color_attr": 600}  # fmt: skip
    for row in rows:
        assert gt.row_problem(row) is None
        assert list(row) == (["tag", "include", "exclude", "prompt"] if row["tag"] == "counting" else
                             ["tag", "include", "prompt"])  # fmt: skip
        assert gt.render(row) == row["prompt"]
        entries = row["include"] + row.get("exclude", [])
        assert all(e["class"] in gt.COCO_CLASSES and e.get("color", "red") in gt.COLORS for e in entries)
        if row["tag"] == "counting":
            assert row["exclude"][0]["count"] == row["include"][0]["count"] + 1
        if len(row["include"]) == 2:
            assert row["include"][0]["class"] != row["include"][1]["class"]
            assert row["include"][0].get("color", 0) != row["include"][1].get("color", 1)
        json.loads(json.dumps(row))  # JSONL-serialisable


def test_generator_without_exclusions_balances_all_six_tags() -> None:
    rows = gt.generate(60, seed=1)
    assert sorted(r["tag"] for r in rows) == sorted(gt.TAGS * 10)


def test_has_free_prompt_and_generator_errors() -> None:
    singles = {gt.row_at("single_object", i)["prompt"] for i in range(80)}
    assert not gt.has_free_prompt("single_object", singles)
    assert gt.has_free_prompt("single_object", set(list(singles)[:79]))
    assert gt.has_free_prompt("colors", singles)  # pigeonhole: 800 > 80
    with pytest.raises(ValueError, match="size must be >= 1"):
        gt.generate(0, seed=0)
    with pytest.raises(ValueError, match="unknown GenEval tags"):
        gt.generate(5, seed=0, tags=["shape"])
    with pytest.raises(ValueError, match="nothing to generate"):
        gt.generate(5, seed=0, excluded=singles, tags=["single_object"])


def test_generator_rejection_leaves_only_the_free_prompts() -> None:
    all_but_one = {gt.row_at("counting", i)["prompt"] for i in range(240) if i != 17}
    rows = gt.generate(20, seed=3, excluded=all_but_one, tags=["counting"])
    assert {r["prompt"] for r in rows} == {gt.row_at("counting", 17)["prompt"]}


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ([], "not a JSON object"),
        ({"tag": "x", "include": [{"class": "a", "count": 1}]}, 'no non-empty "prompt"'),
        ({"include": [{"class": "a", "count": 1}], "prompt": "p"}, 'no "tag" string'),
        ({"tag": "x", "include": [], "prompt": "p"}, 'non-empty "include" list'),
        ({"tag": "x", "include": [{"class": "a", "count": True}], "prompt": "p"}, "include[0].count is True"),
        ({"tag": "x", "include": [{"count": 1}], "prompt": "p"}, 'include[0] has no "class"'),
        ({"tag": "x", "include": [{"class": "a", "count": 1, "color": 3}], "prompt": "p"}, "include[0].color is 3"),
        ({"tag": "x", "include": [{"class": "a", "count": 1, "position": ["above", 0]}], "prompt": "p"},
         "include[0].position is ['above', 0]"),
        ({"tag": "x", "include": [{"class": "a", "count": 1}], "exclude": {}, "prompt": "p"}, '"exclude" is not a list'),
        ({"tag": "x", "include": [{"class": "a", "count": 1}], "exclude": [{"class": "a"}], "prompt": "p"},
         "exclude[0].count is None"),
    ],
)  # fmt: skip
def test_row_problem_names_the_field(row: object, problem: str) -> None:
    assert problem in gt.row_problem(row)


def test_generated_split_through_the_plugin() -> None:
    config = _config(name="geneval", subset="generated", size=500)
    config.train.seed = 11
    ds = nft.get_dataset(config)
    test_prompts = {row["prompt"] for row in _test_rows()}
    assert len(ds) == 500 and ds.stats == {"excluded_test_prompts": 553}
    expected = gt.generate(500, seed=11, excluded=test_prompts)
    assert [ds[i]["prompt"] for i in range(500)] == [r["prompt"] for r in expected]
    assert ds[0]["metadata"] == {k: v for k, v in expected[0].items() if k != "prompt"}
    config.validation.dataset.name = "geneval"
    config.validation.dataset.subset = "generated"
    config.validation.dataset.split = "train"
    config.validation.dataset.size = 500
    val = nft.get_val_dataset(config)  # seed train.seed + 1
    assert [val[i]["prompt"] for i in range(500)] == [r["prompt"] for r in gt.generate(500, 12, test_prompts)]


def test_generator_is_uniform_within_a_tag() -> None:
    rows = gt.generate(2400, seed=5, tags=["counting"])
    by_count = {n: sum(r["include"][0]["count"] == n for r in rows) for n in (2, 3, 4)}
    assert all(abs(c - 800) < 120 for c in by_count.values())  # ~ 6 sigma for Binomial(2400, 1/3)
    assert len({r["prompt"] for r in rows}) == 240  # each prompt missed with p = (239/240)^2400 ~ 5e-5
