"""prepare_data's inputs (grpo_core/data/rows.py, grpo_core/recipe/): dataset sources, the built-in tasks, the
cold-start sources (a file, a trace set, a teacher model) with R1's readability filters."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from grpo_core.config.base import _Strict
from grpo_core.config.sampling import TeacherSampling


class DatasetSource(_Strict):
    """One input data set: a local jsonl/json/parquet/csv file or folder, or a Hugging Face dataset name."""

    path: str = Field(..., min_length=1, description="local file/folder, or a hub name such as openai/gsm8k")
    name: str | None = Field(None, description="dataset config name (e.g. 'main' for openai/gsm8k)")
    split: str = Field("train", description="split to read from a hub dataset or a local dataset folder (a single "
                       "file has none)")
    field_map: dict[str, str] = Field(
        default_factory=lambda: {"prompt": "prompt", "answer": "answer"},
        description="schema field -> source column, e.g. {'prompt': 'question', 'answer': 'answer'}",
    )
    answer_format: Literal["auto", "raw", "gsm8k", "boxed", "none"] = Field(
        "auto", description="gsm8k: text after '####'; boxed: last \\boxed{...}; auto: text after '####' when present, "
        "else a final \\boxed{...} or $...$ unwrapped (rewards.extract.parse_gold_answer); none: a general source "
        "without reference answers (prompts only, answer ''), scored by a reward model or judge"
    )
    task: str = Field("math", min_length=1, description="the rows' task column (unless field_map maps task); math: "
                      "each gold answer must be one expression a math reward can check")
    prompt_template: str | None = Field(None, description="format string with {prompt}, e.g. '{prompt}\\nAnswer in <answer></answer>.'")
    keep_columns: list[str] = Field(default_factory=list, description="extra source columns copied into every row (e.g. tests)")
    max_rows: int | None = Field(None, gt=0, description="read the first N rows")
    source: str | None = Field(None, min_length=1, description="the source name its rows carry (the name mixtures, "
                               "per-source rewards and metrics use); default the file name or hub name")


class ReadabilityConfig(_Strict):
    """R1's readability filters for reasoning samples (``grpo_core.data.readability``); None/False turns one off.

    R1 (sec. 2.3.3) filtered "chain-of-thought with mixed languages, long paragraphs, and code blocks"; truncated
    and overlong chains are dropped too (no answer to learn from / over the SFT budget)."""

    max_other_script_share: float | None = Field(
        0.1, ge=0, le=1, description="mixed language: drop reasoning whose share of CJK (prompt in Latin script) or of "
        "Latin (prompt in CJK) word units is above this")
    max_paragraph_chars: int | None = Field(3000, gt=0, description="long paragraph: drop when a paragraph of the "
                                            "reasoning (text between blank lines) has more characters")
    max_paragraph_words: int | None = Field(None, gt=0, description="long paragraph, counted in words")
    drop_code_blocks: bool = Field(True, description="drop reasoning that holds a ``` code fence")
    drop_truncated: bool = Field(True, description="drop a completion with no closing </think> or nothing after it")
    max_chars: int | None = Field(None, gt=0, description="overlong: drop completions with more characters")
    max_tokens: int | None = Field(None, gt=0, description="overlong: drop completions with more tokens (needs a tokenizer)")


class TraceSource(_Strict):
    """``kind: traces``: a reasoning-trace data set (hub name or local file) whose rows hold a problem and several
    generations with a verdict each, e.g. ``open-r1/OpenR1-Math-220k`` (``grpo_core.recipe.cold_start.load_trace_rows``)."""

    kind: Literal["traces"] = Field("traces", description="the cold-start source's kind (a source without kind is "
                                    "a {prompt, completion} file)")
    dataset: str = Field(..., min_length=1, description="hub name (open-r1/OpenR1-Math-220k) or local jsonl/json/parquet")
    name: str | None = Field(None, description="dataset config name (OpenR1-Math-220k: default, extended or all)")
    split: str = Field("train", description="split to read from a hub dataset or a local dataset folder")
    field_map: dict[str, str] = Field(
        default_factory=lambda: {"prompt": "problem", "generations": "generations", "correct": "correctness_math_verify"},
        description="prompt: the problem column; generations: a list of '<think>..</think> summary' strings (or one "
        "string); correct: a list of booleans, one per generation (omit the key to keep every generation); id: optional")
    prompt_template: str | None = Field(None, description="format string with {prompt}, as the training prompts use")
    limit: int | None = Field(None, gt=0, description="read the first N problems")
    keep_per_prompt: int = Field(1, ge=1, description="k: at most this many traces per problem")
    readability: ReadabilityConfig = Field(default_factory=ReadabilityConfig, description="R1's readability "
                                           "filters each trace must pass")

    @field_validator("field_map")
    @classmethod
    def _check_field_map(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = set(value) - {"prompt", "generations", "correct", "id"}
        if unknown or not {"prompt", "generations"} <= set(value):
            raise ValueError(f"field_map of a trace set maps prompt, generations and optionally correct and id to "
                             f"columns; got keys {sorted(value)}")
        return value


class FewShotExample(_Strict):
    prompt: str = Field(..., min_length=1, description="the example's question, put in a user turn")
    completion: str = Field(..., min_length=1, description="a long chain of thought: <think>...</think> summary")


class TeacherSource(_Strict):
    """``kind: teacher``: long chains of thought sampled from a teacher model with a few-shot long-CoT prompt,
    verified by ``reward_func``, filtered for readability, k kept per prompt (``grpo_core.recipe.cold_start``)."""

    kind: Literal["teacher"] = Field("teacher", description="the cold-start source's kind (a source without kind "
                                     "is a {prompt, completion} file)")
    model: str = Field(..., min_length=1, description="local model folder of the teacher, or run:RUN/STAGE for a "
                       "run's committed model in the pipeline's store (e.g. run:r1-zero/grpo_train)")
    prompts: DatasetSource | None = Field(None, description="prompt rows to sample on; None = the training prompts")
    max_prompts: int | None = Field(None, gt=0, description="sample on the first N prompts")
    few_shot: list[FewShotExample] = Field(default_factory=list, description="worked examples put before each "
                                           "prompt as user/assistant turns (not kept in the written rows)")
    sampling: TeacherSampling = Field(default_factory=TeacherSampling, description="n, temperature, lengths, "
                                      "backend (flat names accepted, SamplingConfig.nest_flat_fields)")
    keep_per_prompt: int = Field(1, ge=1, description="k: at most this many kept per prompt")
    reward_func: str = Field("math_accuracy", description="registered reward that verifies a sample")
    reward_threshold: float = Field(1.0, description="a sample is verified when reward_func scores at least this")
    readability: ReadabilityConfig = Field(default_factory=ReadabilityConfig, description="R1's readability "
                                           "filters each verified sample must pass")
    seed: int = Field(0, description="seed of the teacher's sampling; r1 run --seed sets it")

    @model_validator(mode="before")
    @classmethod
    def _nest_sampling(cls, data: Any) -> Any:
        return TeacherSampling.nest_flat_fields(data)


def _cold_start_kind(value: object) -> str:
    """A cold-start source's tag: its ``kind`` (traces, teacher), or ``file`` when it has none; an unknown kind
    stays as given, so the error lists the tags that exist."""
    return str(value.get("kind", "file")) if isinstance(value, dict) else getattr(value, "kind", "file")


ColdStartSource = Annotated[
    Union[Annotated[DatasetSource, Tag("file")], Annotated[TraceSource, Tag("traces")],
          Annotated[TeacherSource, Tag("teacher")]],
    Discriminator(_cold_start_kind),
]


class CountdownData(_Strict):
    """The built-in countdown task (``grpo_core.data.countdown``), beside the chain task: a task where checking a try
    and retrying pays, so reflection can emerge under RL. Its cold start checks rarely (``check_fraction``); the
    tiny base's corpus (``model.tiny.pretrain``) holds ``pretrain_size`` tries of which ``pretrain_check_fraction``
    check and retry, as a large base model has seen verification."""

    num_train: int = Field(1200, gt=0, description="training prompts, distinct (three numbers in 1..12 make 792 "
                           "problems up to the order of the numbers, 2,808 prompts in all)")
    num_eval: int = Field(200, gt=0, description="held-out problems, distinct, none among the training, cold-start "
                          "or pretraining problems in any order of their numbers (grpo_core.data.countdown.problem_key)")
    max_number: int = Field(12, ge=3, le=99, description="numbers are drawn from 1..max_number")
    operators: str = Field("+", pattern=r"^[-+*]+$", description="the operators a try may use (each row carries "
                           "them; countdown_accuracy accepts these only)")
    transfer_num_eval: int = Field(200, ge=0, description="held-out problems of a harder shape, four numbers "
                                   "(source countdown_transfer, evaluated only); 0: none")
    cold_start_size: int = Field(4000, ge=0, description="cold-start traces (prompts may repeat)")
    check_fraction: float = Field(0.08, ge=0, le=1, description="share of cold-start traces that check each try "
                                  "and retry until one reaches the target; the rest commit to their first try")
    pretrain_size: int = Field(0, ge=0, description="tries in the tiny base's pretraining corpus (beside the "
                               "chain task: needs data.pretrain_size > 0); 0: none")
    pretrain_check_fraction: float = Field(0.3, ge=0, le=1, description="share of the pretraining tries that check "
                                           "and retry")
    retry_order: Literal["random", "systematic"] = Field(
        "systematic", description="checked traces take their tries in the prompt's order (systematic) or at random")
    check_style: Literal["wait", "compare"] = Field(
        "compare", description="checked traces write the target beside each value (compare: 3+8=11?13;wait;...) "
        "or only after a miss (wait: 3+8=11;wait, 11!=13;...)")


class CalcData(_Strict):
    """The built-in calc task (``grpo_core.data.calc``), where a tool pays: two operands too long for a tiny model to
    combine in its head, one ``calculator`` call away. Its cold start calls the calculator rarely (``tool_fraction``);
    the tiny base's corpus holds ``pretrain_size`` sums, of which ``pretrain_tool_fraction`` call the calculator (as a
    large base model has seen tool calls: the skill there, the habit for the cold start and RL to set)."""

    num_train: int = Field(1000, gt=0, description="training prompts, distinct")
    num_eval: int = Field(200, gt=0, description="held-out problems, distinct, none among the training, cold-start or "
                          "pretraining problems in either order of a sum's or product's operands "
                          "(grpo_core.data.calc.problem_key)")
    digits: int = Field(4, ge=2, le=12, description="digits of each operand (no leading zero); four digits make "
                        "~40.5 million distinct sums, two 4,095")
    operators: str = Field("+", pattern=r"^[-+*]+$", description="each prompt's operator is drawn from these "
                           "(subtraction puts the larger operand first)")
    cold_start_size: int = Field(2000, ge=0, description="cold-start traces (prompts may repeat), every one right")
    tool_fraction: float = Field(0.1, ge=0, le=1, description="share of cold-start traces that call the calculator "
                                 "(exactly, rounded); the rest compute in the head")
    pretrain_size: int = Field(0, ge=0, description="sums in the tiny base's pretraining corpus (beside the chain "
                               "task: needs data.pretrain_size > 0); 0: none")
    pretrain_tool_fraction: float = Field(0.0, ge=0, le=1, description="share of the pretraining sums that call the "
                                          "calculator (exactly, rounded); the rest are worked in the head")


class DataConfig(_Strict):
    """prepare_data: built-in task and/or external sources -> normalised, deduplicated, decontaminated splits."""

    builtin_task: Literal["chain"] | None = Field("chain", description="procedurally generated task; None = sources only")
    num_train: int = Field(4000, gt=0, description="built-in task: training prompts")
    num_eval: int = Field(200, gt=0, description="built-in task: held-out prompts")
    min_operands: int = Field(3, ge=2, le=8, description="built-in task: fewest operands (1..9) in a problem")
    max_operands: int = Field(4, ge=2, le=8, description="built-in task: most operands in a problem")
    cold_start_size: int = Field(4000, ge=0, description="built-in task: worked solutions for cold-start SFT")
    cold_start_direct_fraction: float = Field(0.5, ge=0, le=1, description="share of cold-start rows with an empty <think>")
    pretrain_size: int = Field(0, ge=0, description="built-in task: worked solutions (one operation a step) the "
                               "embedded default's tiny model is pretrained on (model.tiny.pretrain); 0: none")
    cold_start_coarse_fraction: float = Field(
        0.0, ge=0, le=1, description="share of cold-start rows worked in coarse steps (two operations a step)")
    countdown: CountdownData | None = Field(
        None, description="the built-in countdown task beside the chain task (grpo_core.data.countdown): its rows "
        "have source countdown, rewarded by countdown_accuracy; None = not built")
    calc: CalcData | None = Field(
        None, description="the built-in calc task, where a calculator call pays (grpo_core.data.calc): its rows have "
        "source calc, rewarded by calc_accuracy; None = not built")
    builtin_general: list[Literal["helpful", "unsafe"]] = Field(
        default_factory=list, description="built-in non-verifiable sources (grpo_core.data.general): prompts, held-out "
        "prompts, cold-start answers and rule-made preference pairs (preferences.parquet)")
    general_num_train: int = Field(1000, gt=0, description="built-in general sources: training prompts per source")
    general_num_eval: int = Field(100, gt=0, description="built-in general sources: held-out prompts per source")
    general_cold_start_size: int = Field(400, ge=0, description="built-in general sources: cold-start rows per source")
    general_cold_start_preferred: float = Field(
        0.3, ge=0, le=1, description="share of general cold-start answers with the preferred property (RL amplifies it)")
    general_pretrain_size: int = Field(0, ge=0, description="built-in general sources: plain echo answers per "
                                       "source in the tiny base's pretraining corpus (a base model can copy text)")
    general_num_pairs: int = Field(1000, ge=0, description="built-in general sources: preference pairs per source")
    train_sources: list[DatasetSource] = Field(default_factory=list, description="training prompt sets (files or "
                                               "hub datasets), beside the built-in tasks' rows")
    eval_sources: list[DatasetSource] = Field(default_factory=list, description="held-out prompt sets, beside the "
                                              "built-in tasks' held-out rows; with no held-out rows at all, "
                                              "eval_fraction of the training rows is held out")
    cold_start_sources: list[ColdStartSource] = Field(
        default_factory=list, description="reasoning traces for real runs: a {prompt, completion} file (field_map "
        "needs prompt and completion), kind: traces (a trace set such as open-r1/OpenR1-Math-220k) or kind: teacher "
        "(sampled from a teacher model); grpo_core.recipe.cold_start"
    )
    eval_fraction: float = Field(0.05, gt=0, lt=1, description="held-out share when no eval_sources are given")
    on_error: Literal["raise", "skip"] = Field("raise", description="a bad row fails the stage, or is skipped and counted")
    dedupe: bool = Field(True, description="keep the first row of each prompt (case and whitespace folded), in the "
                         "training and the held-out rows")
    decontaminate: bool = Field(True, description="drop training and cold-start rows that share a word "
                                "ngram_size-gram with a held-out prompt")
    ngram_size: int = Field(13, ge=1, description="train rows sharing a word n-gram with any eval prompt are dropped "
                            "(compared on the prompt field as read, before any prompt_template)")
    max_contaminated_fraction: float = Field(
        0.5, ge=0, le=1, description="prepare_data fails when decontamination drops more than this share of one "
        "source's rows (train or cold start): so large a share means a shared template or boilerplate, not leaked "
        "eval problems")
    seed: int = Field(0, description="seed of the built-in tasks' rows and of the held-out split; r1 run --seed "
                      "sets it")

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if self.min_operands > self.max_operands:
            raise ValueError(f"min_operands ({self.min_operands}) > max_operands ({self.max_operands})")
        if self.cold_start_direct_fraction + self.cold_start_coarse_fraction > 1:
            raise ValueError(f"cold_start_direct_fraction ({self.cold_start_direct_fraction}) + cold_start_coarse_fraction "
                             f"({self.cold_start_coarse_fraction}) is above 1: they are shares of the same cold-start rows")
        if self.builtin_task is None and not self.train_sources and self.countdown is None and self.calc is None:
            raise ValueError("no training data: set builtin_task: chain or give train_sources")
        for name, task in (("countdown", self.countdown), ("calc", self.calc)):  # alone, a task's own size says
            if task is not None and task.pretrain_size and not self.pretrain_size and self.builtin_task is not None:
                raise ValueError(f"data.{name}.pretrain_size ({task.pretrain_size}) adds to the tiny base's "
                                 "pretraining corpus, and beside the chain task there is none: set "
                                 f"data.pretrain_size (and model.tiny.pretrain) or data.{name}.pretrain_size: 0")
        return self
