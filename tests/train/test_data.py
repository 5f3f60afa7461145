"""Datasets from files and directories; chat prompts; malformed rows named by row and column."""

from __future__ import annotations

import json

import datasets
import pytest

from grouprl.data.load import check_rows, load_dataset_any, render_prompt, reward_columns
from grouprl.errors import DataError

ROWS = [{"prompt": "1+1?", "answer": "2", "tests": "assert f() == 2"},
        {"prompt": "2+2?", "answer": "4", "tests": "assert f() == 4"}]


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_files_of_every_type_load(tmp_path, suffix):
    path = tmp_path / f"train{suffix}"
    ds = datasets.Dataset.from_list(ROWS)
    {".jsonl": lambda: ds.to_json(path, lines=True), ".json": lambda: path.write_text(json.dumps(ROWS)),
     ".csv": lambda: ds.to_csv(path, index=False), ".parquet": lambda: ds.to_parquet(path)}[suffix]()
    loaded = load_dataset_any(str(path), "train")
    assert loaded.to_list() == ROWS
    assert load_dataset_any(str(path), "test") is None  # a single file has no held-out split


def test_directory_with_splits_and_save_to_disk(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS))
    (tmp_path / "d" / "test.jsonl").write_text(json.dumps(ROWS[0]))
    assert len(load_dataset_any(str(tmp_path / "d"), "train")) == 2
    assert load_dataset_any(str(tmp_path / "d"), "test").to_list() == [ROWS[0]]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(tmp_path / "saved")
    assert len(load_dataset_any(str(tmp_path / "saved"), "train")) == 2
    assert load_dataset_any(str(tmp_path / "saved"), "test") is None


def test_missing_file_or_bad_type_is_a_data_error(tmp_path):
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(DataError, match="unsupported type '.txt'"):
        load_dataset_any(str(tmp_path / "x.txt"))


@pytest.mark.parametrize(("prompt", "needle"), [
    ("", "row 1, column 'prompt': empty prompt"),
    (42, "row 1, column 'prompt': expected text or a list of chat messages, got int"),
    ([{"role": "user"}], "row 1, column 'prompt': message 0 must be a mapping with 'role' and 'content'"),
    ([], "row 1, column 'prompt': empty message list"),
])
def test_malformed_row_names_row_and_column(prompt, needle):
    ds = datasets.Dataset.from_dict({"prompt": ["fine", prompt]}) if not isinstance(prompt, (int, list)) else None
    rows = [{"prompt": "fine"}, {"prompt": prompt}]

    class Rows(list):  # mixed types do not fit one Arrow column; check_rows needs only these two things
        column_names = ["prompt"]

        def __getitem__(self, key):
            return [r[key] for r in self] if isinstance(key, str) else list.__getitem__(self, key)

    with pytest.raises(DataError) as e:
        check_rows(ds if ds is not None else Rows(rows))
    assert needle in str(e.value)


def test_missing_prompt_column_lists_the_columns():
    with pytest.raises(DataError, match=r"no column 'prompt' \(columns: question, answer\)"):
        check_rows(datasets.Dataset.from_dict({"question": ["a"], "answer": ["b"]}))


def test_bad_row_stops_the_trainer_before_the_model_loads(tmp_path):
    from grouprl import GRPOConfig, GRPOTrainer

    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "ok", "answer": "1"}\n{"prompt": "", "answer": "2"}\n')
    cfg = GRPOConfig(output_dir=str(tmp_path / "o"), dataset=str(path), model="/nonexistent", num_generations=2,
                     per_device_train_batch_size=2, reward_funcs=["exact"])
    with pytest.raises(DataError, match="row 1, column 'prompt': empty prompt"):
        GRPOTrainer(config=cfg)


def test_chat_prompts_use_the_template_and_other_columns_go_to_rewards(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = render_prompt([{"role": "user", "content": "hi"}], tok, system_prompt="be brief")
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt("plain", tok) == "plain"
    assert reward_columns(ROWS) == {"answer": ["2", "4"], "tests": ["assert f() == 2", "assert f() == 4"]}


@pytest.mark.parametrize(("text", "needle"), [
    ('{"prompt": "ok"}\n\n{"prompt": "x", "answer": "2"\n', "line 3 (row 1) is not valid JSON (Expecting ',' delimiter"),
    ('{"prompt": "ok"}\n["x"]\n', "line 2 (row 1) is a list, not an object"),
])
def test_broken_jsonl_line_is_named(tmp_path, text, needle):
    path = tmp_path / "train.jsonl"
    path.write_text(text)
    with pytest.raises(DataError) as e:
        load_dataset_any(str(path))
    assert needle in str(e.value)
