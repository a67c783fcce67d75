"""reasoning-gym as a task source (``rg:NAME``, ``agentjet.tasks.rg``): the name syntax, the resolver every entry
point uses, the hash split, the extraction before the dataset's own scorer, mixtures as one task type per dataset,
and the errors. No downloads: reasoning-gym's generators are procedural."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentjet.tasks import TaskError, get_task, rg

NEEDS_RG = pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None,
                              reason="reasoning-gym is not installed: pip install 'agentjet[rg]' (the dev extra has it)")
EASY = "rg:chain_sum:level=0"  # two one-digit terms: about 200 distinct questions
MIX = "rg:chain_sum:level=0+spell_backward:level=0+basic_arithmetic:level=0"


# ---- the name syntax (no reasoning-gym needed) ------------------------------------------------------------------


def test_knobs_parse_as_json_scalars_else_strings() -> None:
    specs = rg.parse_name("rg:chain_sum:min_terms=2, max_terms=3,allow_negation=true+spell_backward+x:s=ab,f=0.5")
    assert [s.name for s in specs] == ["chain_sum", "spell_backward", "x"]
    assert specs[0].knobs == {"min_terms": 2, "max_terms": 3, "allow_negation": True}
    assert specs[1].knobs == {}
    assert specs[2].knobs == {"s": "ab", "f": 0.5}
    assert specs[0].label() == "chain_sum:allow_negation=true,max_terms=3,min_terms=2"  # sorted: one canonical form


@pytest.mark.parametrize(("name", "message"), [
    ("rg:", "needs a dataset name"),
    ("rg:chain_sum+", "empty dataset name"),
    ("rg:chain_sum:min_terms", "must look like name=value"),
    ("rg:chain_sum:=2", "must look like name=value"),
    ("rg:chain_sum+chain_sum:level=1", "appear twice"),
])
def test_bad_names_say_what_is_wrong(name: str, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        rg.parse_name(name)


def test_a_config_file_gives_the_same_datasets_as_the_name(tmp_path: Path) -> None:
    cfg = tmp_path / "mix.yaml"
    cfg.write_text("datasets:\n  chain_sum: {min_terms: 2, max_terms: 3}\n  spell_backward:\n"
                   "  basic_arithmetic: {operators: ['+', '-']}\n")
    specs = rg.parse_name(f"rg:{cfg}")
    assert specs[:2] == rg.parse_name("rg:chain_sum:min_terms=2,max_terms=3+spell_backward")
    assert specs[2].knobs == {"operators": ["+", "-"]}  # a list: only a config file can carry it
    (tmp_path / "bad.yaml").write_text("datasets: [chain_sum]\n")
    with pytest.raises(TaskError, match="expected 'datasets"):
        rg.parse_name(f"rg:{tmp_path / 'bad.yaml'}")
    (tmp_path / "extra.json").write_text('{"datasets": {"chain_sum": {}}, "weights": {}}')
    with pytest.raises(TaskError, match="unknown keys"):
        rg.parse_name(f"rg:{tmp_path / 'extra.json'}")
    with pytest.raises(TaskError, match="does not exist"):
        rg.parse_name(f"rg:{tmp_path / 'missing.yaml'}")


def test_without_reasoning_gym_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # None in sys.modules: ImportError on import
    with pytest.raises(TaskError, match=r"pip install 'agentjet\[rg\]'"):
        rg.ReasoningGymTask(rg.parse_name("rg:chain_sum"))


def test_close_names_are_listed() -> None:
    known = ["chain_sum", "decimal_chain_sum", "spell_backward", "word_sorting"]
    with pytest.raises(TaskError, match="close names: chain_sum, decimal_chain_sum"):
        rg.check_dataset_name("chain_sums", known)
    with pytest.raises(TaskError, match="no close names"):
        rg.check_dataset_name("zzzzzz", known)
    rg.check_dataset_name("chain_sum", known)  # a real name passes


# ---- resolving and generating (reasoning-gym) --------------------------------------------------------------------


@NEEDS_RG
@pytest.mark.parametrize(("name", "message"), [
    ("rg:chain_sums", "close names: chain_sum"),
    ("rg:spell_backwards:level=0", "close names: spell_backward"),
    ("rg:chain_sum:min_term=2", r"unknown knob\(s\) \{'min_term': \['min_terms'"),
    ("rg:chain_sum:min_terms=5,max_terms=2", "refuses these knobs"),
    ("rg:chain_sum:level=-1", "level must be an integer"),
    ("rg:chain_sum:size=many", "size must be an integer"),
    ("rg:gsm_symbolic:level=0", "no curriculum"),
    ("rg:composite", "rg:A\\+B\\+C"),
])
def test_the_resolver_refuses_what_reasoning_gym_does_not_have(name: str, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        get_task(name)


@NEEDS_RG
def test_the_curriculum_level_sets_the_knobs_and_explicit_knobs_win() -> None:
    config = rg.make_config(rg.DatasetSpec("chain_sum", {"level": 0}), size=10)
    assert (config.min_terms, config.max_terms, config.min_digits, config.max_digits) == (2, 2, 1, 1)
    config = rg.make_config(rg.DatasetSpec("chain_sum", {"level": 2, "max_digits": 1}), size=10)
    assert (config.max_terms, config.max_digits) == (4, 1)
    assert config.seed == rg.DEFAULT_SEED  # generation is deterministic unless a seed is given


@NEEDS_RG
def test_train_and_eval_are_disjoint_by_the_question_and_eval_holds_50() -> None:
    task = get_task(EASY)
    data = task.datasets["chain_sum"]
    train, held = set(data.splits["train"]), set(data.splits["eval"])
    assert not train & held and len(train | held) == len(data.entries)
    assert len(held) >= rg.MIN_EVAL
    assert held == {q for q in data.entries if rg.question_hash(q) < rg.EVAL_FRACTION}  # by hash, not index
    # the generated tasks keep their split, through many cycles of the split
    train_q = {t["question"] for t in task.generate_tasks("train", 2000, seed=3)}
    eval_q = {t["question"] for t in task.generate_tasks("eval", 500, seed=0)}
    assert train_q == train and eval_q == held
    assert {t["split"] for t in task.generate_tasks("eval", 5)} == {"eval"}
    # a question is in the same split whatever the generator's seed (a split by hash, not by position)
    other = rg.Dataset(rg.DatasetSpec("chain_sum", {"level": 0, "seed": 7}))
    common = set(other.entries) & set(data.entries)
    assert len(common) > 100
    assert all((q in other.splits["eval"]) == (q in held) for q in common)


@NEEDS_RG
def test_a_small_question_space_holds_out_the_lowest_hashes_or_fails_naming_the_knobs() -> None:
    few = rg.Dataset(rg.DatasetSpec("count_bits", {"min_n": 1, "max_n": 150}))  # 150 distinct questions
    assert len(few.entries) == 150
    assert sum(rg.question_hash(q) < rg.EVAL_FRACTION for q in few.entries) < rg.MIN_EVAL  # the quarter is short
    ranked = sorted(few.entries, key=rg.question_hash)
    assert few.splits["eval"] == sorted(ranked[:rg.MIN_EVAL]) and len(few.splits["train"]) == 100
    with pytest.raises(TaskError, match=r"knobs \{'min_n': 1, 'max_n': 60\} allow only 60 distinct questions"):
        rg.Dataset(rg.DatasetSpec("count_bits", {"min_n": 1, "max_n": 60}))


@NEEDS_RG
def test_the_generator_size_grows_until_the_eval_split_holds_50() -> None:
    grown = rg.Dataset(rg.DatasetSpec("basic_arithmetic", {"level": 0, "size": 60}))
    assert grown.size > 60 and len(grown.splits["eval"]) >= rg.MIN_EVAL
    assert all(rg.question_hash(q) < rg.EVAL_FRACTION for q in grown.splits["eval"])


@NEEDS_RG
def test_the_prompt_states_the_answer_format() -> None:
    source = get_task(EASY)
    task = source.generate_tasks("eval", 1)[0]
    system, *shots, asked = task["messages"]
    assert system["role"] == "system" and "<answer>" in system["content"] and "</answer>" in system["content"]
    assert asked == {"role": "user", "content": task["question"]}
    # the worked examples are distinct train questions, answered in the format the reward extracts, and score 1
    dataset = source.datasets[task["dataset"]]
    assert len(shots) == 2 * rg.EXAMPLES
    examples = [m["content"] for m in shots[::2]]
    assert len(set(examples)) == rg.EXAMPLES
    for example, shown in zip(shots[::2], shots[1::2], strict=True):
        assert example["role"] == "user" and shown["role"] == "assistant"
        assert example["content"] in dataset.splits["train"] and example["content"] not in dataset.splits["eval"]
        assert shown["content"].startswith("<answer>")
        assert source.reward({**task, "entry": dataset.entries[example["content"]]}, shown["content"]) == 1.0


@NEEDS_RG
@pytest.mark.parametrize(("reply", "low", "high"), [
    ("<answer>{a}</answer>", 1.0, 1.0),
    ("Let me add them. <answer>{a}</answer> Hope that helps!", 1.0, 1.0),  # text outside the block is ignored
    ("<answer>wrong</answer> then <answer>{a}</answer>", 1.0, 1.0),  # the last block counts
    ("<answer>{a}</answer> then <answer>{b}</answer>", 0.0, 0.0),
    ("<answer>{b}</answer>", 0.0, 0.0),
    ("<answer>{a}1</answer>", 0.01, 0.99),  # chain_sum's scorer gives partial credit when the answer holds it
    ("{a}", 0.0, 0.0),  # no answer block: no answer
    ("", 0.0, 0.0),
])
def test_the_answer_is_extracted_then_scored(reply: str, low: float, high: float) -> None:
    task = get_task(EASY).generate_tasks("eval", 1)[0]
    wrong = str(int(task["answer"]) + 1)
    assert task["answer"] not in wrong
    assert low <= get_task(EASY).reward(task, reply.format(a=task["answer"], b=wrong)) <= high


@NEEDS_RG
def test_extraction_removes_the_partial_credit_extra_text_gets_from_the_raw_scorer() -> None:
    task_src = get_task(EASY)
    task = task_src.generate_tasks("eval", 1)[0]
    data = task_src.datasets["chain_sum"].data
    chatty = f"The answer is {task['answer']}"
    assert 0.0 < data.score_answer(chatty, task["entry"]) < 1.0  # reasoning-gym alone gives partial credit
    assert task_src.reward(task, chatty) == 0.0
    assert task_src.reward(task, f"{chatty}: <answer>{task['answer']}</answer>") == 1.0


@NEEDS_RG
def test_the_reward_is_the_datasets_own_score(monkeypatch: pytest.MonkeyPatch) -> None:
    task_src = get_task(EASY)
    task = task_src.generate_tasks("train", 1)[0]
    seen: list[tuple[Any, Any]] = []

    def score_answer(answer: Any, entry: Any) -> float:
        seen.append((answer, entry))
        return 0.37

    monkeypatch.setattr(task_src.datasets["chain_sum"].data, "score_answer", score_answer)
    assert task_src.reward(task, "<answer> 12 </answer>") == 0.37
    assert seen == [("12", task["entry"])]  # the extracted, stripped answer and the dataset's own entry

    def broken(answer: Any, entry: Any) -> float:
        raise ValueError("cannot parse")

    monkeypatch.setattr(task_src.datasets["chain_sum"].data, "score_answer", broken)
    assert task_src.reward(task, "<answer>x</answer>") == 0.0  # a scorer that fails scores the answer wrong


@NEEDS_RG
def test_a_mixture_is_a_cocktail_of_one_task_type_per_dataset() -> None:
    from agentjet.apps.demo import DemoSettings, server_config

    task = get_task(MIX)
    assert task.NAME == MIX
    names = ["chain_sum", "spell_backward", "basic_arithmetic"]
    train = task.generate_tasks("train", 300, seed=1)
    assert [t["task_type"] for t in train[:6]] == names * 2
    assert {n: sum(t["task_type"] == n for t in train) for n in names} == dict.fromkeys(names, 100)
    for t in train[:3]:
        assert t["task_id"].startswith(f"rg-{t['task_type']}-train-")
        assert task.reward(t, f"<answer>{t['answer']}</answer>") == 1.0  # each task scored by its own dataset
    ev = task.generate_tasks("eval", task.RECOMMENDED.eval_n)
    assert len({t["task_id"] for t in ev}) == 150  # 50 distinct held-out questions per dataset
    assert not {t["question"] for t in ev} & {t["question"] for t in task.generate_tasks("train", 3000)}
    # the recommended run gives each type an equal share of every batch: the server's quotas
    assert task.RECOMMENDED.task_ratios == pytest.approx(dict.fromkeys(names, 1 / 3))
    config = server_config(DemoSettings(task=MIX), 1234, task.RECOMMENDED)
    assert config.training.task_ratios == pytest.approx(dict.fromkeys(names, 1 / 3))
    assert get_task(EASY).RECOMMENDED.task_ratios == {}  # one dataset: no quotas


@NEEDS_RG
def test_every_entry_point_resolves_rg_names_through_get_task(tmp_path: Path) -> None:
    from agentjet.apps.research.spec import TrialClientSettings
    from agentjet.apps.research.trial_client import eval_n_for, load_task
    from agentjet.cli import app

    assert load_task(EASY) is get_task(EASY)  # one resolver, cached per process
    assert eval_n_for(TrialClientSettings(task=MIX)) == 150
    runner = CliRunner()
    for args in (["demo", "--task", "rg:chain_sums"], ["bench", "--learn", "--task", "rg:chain_sums"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "unknown reasoning-gym dataset 'chain_sums'" in result.output and "chain_sum" in result.output


@NEEDS_RG
async def test_the_task_workflow_scores_a_reply_with_the_rg_reward() -> None:
    from agentjet.client.runner import task_workflow

    task_src = get_task(EASY)
    task = {**task_src.generate_tasks("eval", 1)[0], "index": 0}
    sent: list[dict[str, Any]] = []

    class Completions:
        async def create(self, **kwargs: Any) -> Any:
            sent.append(kwargs)
            message = type("M", (), {"content": f"Sure. <answer>{task['answer']}</answer>"})
            return type("R", (), {"choices": [type("C", (), {"message": message})]})

    class Episode:
        def openai(self) -> Any:
            return type("O", (), {"chat": type("Ch", (), {"completions": Completions()})})

    traces: list[tuple[dict[str, Any], Any]] = []
    reward = await task_workflow(task_src, task_src.EVAL_SAMPLING, model="m", traces=traces)(task, Episode())  # type: ignore[arg-type]
    assert reward == 1.0
    assert sent[0]["messages"] == task["messages"] and sent[0]["seed"] == task_src.EVAL_SAMPLING["seed"]
    # with traces, the demo keeps the reply and its reward (its transcripts and per-type eval)
    [(traced, trace)] = traces
    assert traced is task and trace.reward == 1.0 and trace.transcript == [f"Sure. <answer>{task['answer']}</answer>"]


@NEEDS_RG
def test_the_demo_draws_a_cocktails_types_equally() -> None:
    """The demo's train pool holds as many tasks of each dataset, types in turn, so the curriculum's uniform draws
    match the equal quotas (unequal draws stalled a cocktail run: docs/environments.md)."""
    from collections import Counter

    from agentjet.apps.demo import train_pool

    source = get_task(MIX)
    pool = train_pool(source)
    counts = Counter(t["task_type"] for t in pool)
    smallest = min(len(d.splits["train"]) for d in source.datasets.values())
    assert set(counts) == set(source.datasets) and set(counts.values()) == {smallest}
    assert [t["task_type"] for t in pool[:3]] == list(source.datasets)
    assert len({t["task_id"] for t in pool}) == len(pool)
    assert all(t["split"] == "train" for t in pool)
    single = get_task(EASY)  # one type: every distinct train task
    assert len(train_pool(single)) == len(single.datasets["chain_sum"].splits["train"])
