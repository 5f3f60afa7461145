"""Golden loss masks of a two-turn tool trajectory under three template families, prefix checks, stacking.

The ChatML and Llama-3 fixtures use a byte-per-token tokenizer (rollout_helpers.char_tokenizer), so every
expected vector below is counted by hand from the rendered text: one token per special/added token and
one per character.
"""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import (
    F_TOOL,
    FIXTURES,
    FakeEnv,
    chatml_tokenizer,
    llama3_tokenizer,
    scripted_generate,
    template,
)

from grouprl.cli import main
from grouprl.rollout.chat import (
    TemplateError,
    check_prefix_preserving,
    load_chat_template,
    stop_token_ids,
    tool_turn_ids,
)
from grouprl.rollout.multiturn import MultiTurnParams, MultiTurnRollout
from grouprl.rollout.trajectory import Trajectory, stack_trajectories


def _run(tok, scripts, env=FakeEnv, **kw):
    gen = scripted_generate(tok, scripts)
    rollout = MultiTurnRollout(tok, gen, MultiTurnParams(max_turns=3, max_new_tokens=200), env_factory=env, **kw)
    return rollout.run([{"prompt": "hi"}])[0]


def _check_concat(tok, traj, sampled_texts, tool_ids_list):
    expected = []
    for k, text in enumerate(sampled_texts):
        expected += tok.encode(text, add_special_tokens=False)
        if k < len(tool_ids_list):
            expected += tool_ids_list[k]
    assert traj.completion_ids == expected


def test_chatml_two_turn_mask_is_exact_and_the_newline_after_im_end_is_glue():
    tok = chatml_tokenizer()
    t = _run(tok, [["<tool_call>f()</tool_call><|im_end|>", "7<|im_end|>"]])
    # sampled: <tool_call> f ( ) </tool_call> <|im_end|>                                     -> 6 ones
    # tool turn: \n <|im_start|> u s e r \n <tool_response> \n 7 \n </tool_response> <|im_end|> \n
    #            <|im_start|> a s s i s t a n t \n                                             -> 25 zeros
    # sampled: 7 <|im_end|>                                                                  -> 2 ones
    assert t.loss_mask == [1] * 6 + [0] * 25 + [1] * 2
    assert t.end_reason == "answered" and t.num_turns == 2
    ids = t.completion_ids
    assert tok.convert_ids_to_tokens(ids[5]) == "<|im_end|>" and t.loss_mask[5] == 1  # sampled EOS: trained
    assert tok.decode([ids[6]]) == "\n" and t.loss_mask[6] == 0  # template glue: never sampled
    assert tok.decode(ids[6:31]) == ("\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n"
                                     "<|im_start|>assistant\n")
    assert tok.decode(t.prompt_ids) == ("<|im_start|>system\nTools: f add boom slow<|im_end|>\n"
                                        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    tool_msg = [{"role": "tool", "name": "f", "content": "7"}]
    turn = tool_turn_ids(tok, t.messages[:2], tool_msg, FakeEnv.tools)
    _check_concat(tok, t, ["<tool_call>f()</tool_call><|im_end|>", "7<|im_end|>"], [turn])
    assert t.messages[2] == {"role": "tool", "name": "f", "content": "7"}


def test_chatml_two_calls_in_one_turn_share_one_user_turn():
    tok = chatml_tokenizer()
    t = _run(tok, [["<tool_call>f()</tool_call><tool_call>add(a=1, b=2)</tool_call><|im_end|>", "ok<|im_end|>"]])
    # sampled: <tool_call> f()(3) </tool_call> <tool_call> add(a=1, b=2)(13) </tool_call> <|im_end|>  -> 21
    # tool turn: \n <|im_start|> user(4) \n <tool_response> \n 7 \n </tool_response> \n <tool_response> \n 3 \n
    #            </tool_response> <|im_end|> \n <|im_start|> assistant(9) \n                           -> 31
    # sampled: o k <|im_end|>                                                                         -> 3
    assert t.loss_mask == [1] * 21 + [0] * 31 + [1] * 3
    assert [c["result"] for c in t.tool_calls] == ["7", "3"]


def test_llama3_two_turn_mask_is_exact_and_has_no_glue_after_eot():
    tok = llama3_tokenizer()
    t = _run(tok, [["<tool_call>f()</tool_call><|eot_id|>", "7<|eot_id|>"]])
    # sampled: <tool_call> f ( ) </tool_call> <|eot_id|>                                          -> 6 ones
    # tool turn: <|start_header_id|> ipython(7) <|end_header_id|> \n \n 7 <|eot_id|>
    #            <|start_header_id|> assistant(9) <|end_header_id|> \n \n                         -> 26 zeros
    # sampled: 7 <|eot_id|>                                                                       -> 2 ones
    assert t.loss_mask == [1] * 6 + [0] * 26 + [1] * 2
    assert tok.convert_ids_to_tokens(t.completion_ids[6]) == "<|start_header_id|>"
    assert tok.decode(t.prompt_ids).startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    turn = tool_turn_ids(tok, t.messages[:2], [t.messages[2]], FakeEnv.tools)
    _check_concat(tok, t, ["<tool_call>f()</tool_call><|eot_id|>", "7<|eot_id|>"], [turn])


@pytest.mark.parametrize("chat_template", [None, "chatml_tools.jinja"])
def test_tiny_tokenizer_two_turn_mask(chat_template):
    from grouprl.builtin.tiny import build_tokenizer

    tok = build_tokenizer()
    kw = {"chat_template": load_chat_template(str(FIXTURES / chat_template))} if chat_template else {}
    s1, s2 = "<tool_call>f()</tool_call><|im_end|>", "7<|im_end|>"
    t = _run(tok, [[s1, s2]], **kw)
    tool_text = ("\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n" if chat_template is None else
                 "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    n1, n2 = len(tok.encode(s1, add_special_tokens=False)), len(tok.encode(s2, add_special_tokens=False))
    tool_ids = t.completion_ids[n1:len(t.completion_ids) - n2]
    assert tok.decode(tool_ids) == tool_text and tool_ids == tok.encode(tool_text, add_special_tokens=False)
    assert t.loss_mask == [1] * n1 + [0] * len(tool_ids) + [1] * n2
    assert tok.decode([tool_ids[0]]) == "\n"  # the glue after the sampled <|im_end|> has mask 0
    assert t.end_reason == "answered"


def test_stop_tokens_are_the_end_of_turn_tokens():
    assert [chatml_tokenizer().convert_ids_to_tokens(i) for i in stop_token_ids(chatml_tokenizer())] == \
        ["<|endoftext|>", "<|im_end|>"]
    tok = llama3_tokenizer()
    assert [tok.convert_ids_to_tokens(i) for i in stop_token_ids(tok)] == ["<|eot_id|>"]


def test_non_prefix_preserving_template_raises_a_clear_error():
    tok = chatml_tokenizer(template("think_dropping.jinja"))
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": "<think>plan</think><tool_call>f()</tool_call>"}]
    with pytest.raises(TemplateError) as err:
        tool_turn_ids(tok, history, [{"role": "tool", "name": "f", "content": "7"}], [F_TOOL])
    msg = str(err.value)
    assert "not prefix-preserving" in msg and "chat_template=" in msg and "<think>plan</think>" in msg
    assert "check-template" in msg
    # the rollout raises it too, and closes every environment it opened
    FakeEnv.instances.clear()
    with pytest.raises(TemplateError):
        _run(tok, [["<think>plan</think><tool_call>f()</tool_call><|im_end|>", "7<|im_end|>"]])
    assert FakeEnv.instances and all(e.closed.is_set() for e in FakeEnv.instances)
    report = check_prefix_preserving(tok)
    assert not report.ok and "not prefix-preserving" in report.reason


def test_check_prefix_preserving_report_for_the_demo_conversation():
    report = check_prefix_preserving(chatml_tokenizer())
    assert report.ok and report.retokenize_matches
    zeros = [p for p, m in zip(report.pieces, report.loss_mask) if m == 0]
    assert "".join(zeros) == ("\n<|im_start|>user\n<tool_response>\n7\n</tool_response>\n<tool_response>\n"
                              "sunny, 21 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert report.pieces[-1] == "<|im_end|>" and report.loss_mask[-1] == 1


def test_check_template_cli(tmp_path, capsys):
    chatml_tokenizer().save_pretrained(tmp_path / "tok")
    assert main(["check-template", str(tmp_path / "tok")]) == 0
    out = capsys.readouterr().out
    assert "OK (prefix-preserving)" in out and "   0  " in out and "   1  " in out
    assert main(["check-template", "tiny"]) == 0
    capsys.readouterr()
    bad = str(FIXTURES / "think_dropping.jinja")
    assert main(["check-template", str(tmp_path / "tok"), "--chat-template", bad]) == 1
    assert "not prefix-preserving" in capsys.readouterr().err


def test_stack_trajectories_pads_and_masks():
    a = Trajectory(prompt_ids=[5, 6, 7], completion_ids=[1, 2, 3, 4], loss_mask=[1, 0, 0, 1], end_reason="answered",
                   group=0)
    b = Trajectory(prompt_ids=[8], completion_ids=[9, 9], loss_mask=[1, 1], end_reason="max_tokens", group=1)
    batch = stack_trajectories([a, b], pad_id=0)
    assert batch.prompt_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch.prompt_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.completion_ids.tolist() == [[1, 2, 3, 4], [9, 9, 0, 0]]
    assert batch.completion_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch.loss_mask.tolist() == [[1, 0, 0, 1], [1, 1, 0, 0]]
    assert batch.truncated.tolist() == [False, True] and batch.group.tolist() == [0, 1]
    assert batch.rollout_logp is None and batch.loss_mask.dtype == torch.long
    with pytest.raises(ValueError, match="loss_mask has 1 entries for 2"):
        stack_trajectories([Trajectory(prompt_ids=[1], completion_ids=[1, 2], loss_mask=[1])], pad_id=0)
