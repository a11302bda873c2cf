"""LLM-as-judge rewards, the part that needs no model: the judge's prompt and the score in its answer.

``reward_model.reward_manager=judge`` asks a generative model (served by one of hybridrl's rollout
engines, :mod:`hybridrl.workers.llm_judge`) to grade every response of a batch. This module holds
what surrounds that call and is pure Python: the settings (:class:`JudgeSettings`, read and checked
once from ``reward_model.model``, ``reward_model.rollout`` and ``reward_model.judge``), the prompt
template (:func:`load_template`, :func:`render_template`) and the score parser
(:func:`parse_score`, or the user's function named by ``reward_model.judge.score_parser``).

verl has no built-in judge: its GenRM is a ``custom_reward_function`` that formats a prompt, calls
the reward model's server and parses the answer. The key names it uses are taken here
(``reward_model.model.path``, ``reward_model.rollout.*``); template and parser are hybridrl's keys.
"""

from __future__ import annotations

import math
import os
import re
import string
from dataclasses import dataclass
from typing import Any, Callable

from hybridrl.errors import UserError
from hybridrl.rewards.custom import RewardConfigError, import_reward_file
from hybridrl.rewards.settings import plain

__all__ = [
    "DEFAULT_TEMPLATE",
    "DEFAULT_TEMPLATE_WITH_REFERENCE",
    "TEMPLATE_FIELDS",
    "JudgeParseError",
    "JudgePromptError",
    "JudgeSettings",
    "load_template",
    "render_template",
    "parse_score",
    "load_score_parser",
]

TEMPLATE_KEY = "reward_model.judge.prompt_template"
# Fields a template may use; {extra_info[key]} reads one key of the row's extra_info dict.
TEMPLATE_FIELDS = ("response", "question", "prompt", "ground_truth", "data_source", "extra_info")

DEFAULT_TEMPLATE = """Rate how well the answer responds to the question, from 0 (wrong or useless) to 10 \
(correct and helpful).

Question:
{question}

Answer:
{response}

Reply with the rating only, as "Score: <number>"."""

DEFAULT_TEMPLATE_WITH_REFERENCE = """Rate the answer to the question against the reference answer, from 0 \
(wrong) to 10 (correct: it agrees with the reference).

Question:
{question}

Reference answer:
{ground_truth}

Answer to rate:
{response}

Reply with the rating only, as "Score: <number>"."""

_NUM = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_DENOMINATOR = rf"(?:\s*(?:/|out\s+of)\s*({_NUM}))?"
# Tried in this order; the last match in the text counts (a judge that reasons first ends with its verdict).
_DEFAULT_PATTERNS = (
    re.compile(rf"<score>\s*({_NUM}){_DENOMINATOR}\s*</score>", re.IGNORECASE),
    re.compile(rf"\b(?:score|rating|grade)\b[\s*:=]*(?:is\s+)?\**({_NUM}){_DENOMINATOR}", re.IGNORECASE),
    re.compile(rf"({_NUM})\s*(?:/|out\s+of)\s*({_NUM})", re.IGNORECASE),
    re.compile(rf"({_NUM})"),
)


class JudgeParseError(ValueError):
    """The judge's answer holds no usable score (no number, or one outside the scale)."""


class JudgePromptError(UserError, ValueError):
    """The judge's prompt for a row cannot be built (a field the row lacks, too many tokens)."""


def load_template(value: Any, key: str = TEMPLATE_KEY) -> str | None:
    """The prompt template a config value names: the text of an existing file, else the string itself.

    Args:
        value: ``reward_model.judge.prompt_template``: None (the built-in templates), a
            ``str.format`` template, or the path of a file holding one.

    Returns:
        The checked template, or None for the built-in ones.

    Raises:
        RewardConfigError: a path that does not exist, or a template that is not valid
            (unknown field, positional field, unmatched brace, no ``{response}``).
    """
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise RewardConfigError(f"{key}={value!r} must be a str.format template or the path of a file holding one")
    path = os.path.expanduser(value)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            template, where = f.read(), f"{key}={value!r} (the file)"
    elif "{" not in value and (os.sep in value or value.endswith((".txt", ".md", ".jinja", ".tmpl"))):
        raise RewardConfigError(
            f"{key}={value!r}: no such file; point it to a file holding the template, or "
            "write the template itself (with a {response} field)"
        )
    else:
        template, where = value, f"{key}={value!r}"
    check_template(template, where)
    return template


def check_template(template: str, where: str = TEMPLATE_KEY) -> set[str]:
    """The fields ``template`` uses, after checking them (see :func:`load_template`)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise RewardConfigError(f"{where}: {exc}; write {{{{ and }}}} for literal braces") from None
    fields = set()
    for _, name, _, _ in parsed:
        if name is None:
            continue
        root = re.split(r"[.\[]", name, maxsplit=1)[0]
        if root not in TEMPLATE_FIELDS:
            shown = "{" + name + "}"
            raise RewardConfigError(
                f"{where}: unknown field {shown}; fields: "
                f"{', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)} "
                "({extra_info[key]} for a key of the row's extra_info); write {{ and }} "
                "for literal braces"
            )
        fields.add(root)
    if "response" not in fields:
        raise RewardConfigError(
            f"{where}: the template has no {{response}} field, so the judge would never see "
            "the answer it grades; add {response}"
        )
    return fields


def render_template(
    template: str | None,
    *,
    response: str,
    prompt: str,
    question: str | None = None,
    ground_truth: Any = None,
    data_source: Any = None,
    extra_info: dict | None = None,
) -> str:
    """The judge's prompt for one row.

    ``template`` None picks :data:`DEFAULT_TEMPLATE_WITH_REFERENCE` when the row has a ground truth
    and :data:`DEFAULT_TEMPLATE` otherwise. ``question`` defaults to ``prompt``.

    Raises:
        JudgePromptError: the template reads a value the row lacks (``{ground_truth}`` of a row
            without one, a missing ``{extra_info[key]}``).
    """
    has_truth = ground_truth is not None and str(ground_truth).strip() != ""
    if template is None:
        template = DEFAULT_TEMPLATE_WITH_REFERENCE if has_truth else DEFAULT_TEMPLATE
    elif not has_truth and "ground_truth" in check_template(template):
        raise JudgePromptError(f"{TEMPLATE_KEY} uses {{ground_truth}} but this row has none")
    values = dict(
        response=response,
        prompt=prompt,
        question=prompt if question is None else question,
        ground_truth="" if ground_truth is None else ground_truth,
        data_source=data_source,
        extra_info=dict(extra_info or {}),
    )
    try:
        return template.format(**values)
    except (KeyError, IndexError, AttributeError) as exc:
        raise JudgePromptError(f"{TEMPLATE_KEY} reads {exc} which this row's extra_info lacks") from None


def _as_number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JudgeParseError(f"the score {text!r} is not a finite number")
    return value


def _scaled(number: float, denominator: str | None, score_range: tuple[float, float], snippet: str) -> float:
    """``number`` as a score in [0, 1]: ``x/y`` (or ``x out of y``) is the fraction; a bare number
    sits on ``score_range``. Raises JudgeParseError outside it."""
    if denominator is not None:
        den = _as_number(denominator)
        if den > 0 and 0 <= number <= den:
            return number / den
        raise JudgeParseError(f"the score {snippet!r} is not a fraction between 0 and 1")
    lo, hi = score_range
    if not lo <= number <= hi:
        raise JudgeParseError(
            f"the score {number:g} in {snippet!r} is outside reward_model.judge.score_range [{lo:g}, {hi:g}]"
        )
    return (number - lo) / (hi - lo)


def parse_score(
    text: str, score_range: tuple[float, float] = (0.0, 10.0), pattern: re.Pattern | str | None = None
) -> tuple[float, float]:
    """The score in a judge's answer.

    Default (``pattern`` None): the last ``<score>x</score>``, else the last ``Score: x`` (also
    ``Rating``/``Grade``, ``=``, ``is``), else the last ``x/y`` or ``x out of y``, else the last
    number. With ``pattern``: its last match; the number is the group named ``score``, else group 1.

    Args:
        text: the judge's answer.
        score_range: ``(lo, hi)``, the judge's scale; a bare number ``x`` becomes
            ``(x - lo) / (hi - lo)``. A fraction ``x/y`` becomes ``x / y`` whatever the scale.

    Returns:
        ``(score in [0, 1], the number as the judge wrote it)``.

    Raises:
        JudgeParseError: no number, or one outside the scale (the message quotes the answer).
    """
    shown = " ".join(str(text).split())
    shown = shown if len(shown) <= 120 else shown[:117] + "..."
    if pattern is not None:
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        matches = list(regex.finditer(text))
        if not matches:
            raise JudgeParseError(
                f"reward_model.judge.score_pattern={regex.pattern!r} does not match the judge's answer {shown!r}"
            )
        match = matches[-1]
        raw = match.group("score") if "score" in regex.groupindex else match.group(1)
        try:
            number = _as_number(raw)
        except (TypeError, ValueError):
            raise JudgeParseError(
                f"reward_model.judge.score_pattern captured {raw!r}, not a number, in {shown!r}"
            ) from None
        return _scaled(number, None, score_range, match.group(0)), number
    for regex in _DEFAULT_PATTERNS:
        matches = list(regex.finditer(text))
        if matches:
            match = matches[-1]
            number = _as_number(match.group(1))
            denominator = match.group(2) if regex.groups >= 2 else None
            return _scaled(number, denominator, score_range, match.group(0)), number
    raise JudgeParseError(f"no score in the judge's answer {shown!r}")


def load_score_parser(path: str, name: str) -> Callable[..., Any]:
    """The user's parser ``name`` in the Python file ``path`` (``reward_model.judge.score_parser``).

    It is called as ``fn(judge_text, data_source=, solution_str=, ground_truth=, extra_info=)`` and
    returns the score (a float, or a dict with ``"score"`` and other values to log), used as it is;
    raising (or returning None) marks the judgement unparseable.

    Raises:
        RewardConfigError: the file does not exist, does not import, or has no such function.
    """
    key = "reward_model.judge.score_parser"
    full = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(full):
        raise RewardConfigError(
            f"{key}.path={path!r}: file {full} does not exist; set it to the .py file that defines your parser"
        )
    try:
        module = import_reward_file(full)
    except RewardConfigError as exc:
        raise RewardConfigError(f"{key}.path={path!r}: {str(exc).split(': ', 1)[-1]}") from exc
    fn = getattr(module, name, None) if isinstance(name, str) and name else None
    if not callable(fn):
        raise RewardConfigError(f"{key}.name={name!r} is not a function in {full}; set it to your parser's name")
    return fn


def _score_range(value: list[float]) -> tuple[float, float]:
    key = "reward_model.judge.score_range"
    if len(value) != 2 or not all(math.isfinite(v) for v in value) or value[0] >= value[1]:
        shown = "[" + ", ".join(f"{v:g}" for v in value) + "]"
        raise RewardConfigError(
            f"{key}={shown} must be two numbers [lo, hi] with lo < hi, the judge's scale (e.g. [0, 10])"
        )
    return float(value[0]), float(value[1])


@dataclass(frozen=True)
class JudgeSettings:
    """What ``reward_manager=judge`` reads from the config, checked once (:meth:`from_config`).

    ``rollout`` is the judge engine's section (``reward_model.rollout``) as a plain dict;
    ``timeout_s`` bounds one batched judge call, in seconds.
    """

    model_path: str
    trust_remote_code: bool
    rollout: dict
    template: str | None
    system_prompt: str | None
    apply_chat_template: bool
    response_prefix: str
    score_pattern: str | None
    score_range: tuple[float, float]
    parser_path: str | None
    parser_name: str
    timeout_s: float

    @classmethod
    def from_config(cls, config: Any) -> JudgeSettings:
        """Read and check the judge's keys of the whole PPO config as the run reads it (typed:
        ``hybridrl.trainer.ppo.config.typed_ppo_config``); no model is loaded.

        Raises:
            RewardConfigError: one line naming the key, what is wrong and what to do.
        """
        rm, judge, key = config.reward_model, config.reward_model.judge, "reward_model.judge"
        if not rm.model.path:
            raise RewardConfigError(
                "reward_model.reward_manager=judge needs reward_model.model.path, the judge "
                "model (an HF folder, a .gguf file, or HuggingFaceTB/SmolLM2-135M-Instruct)"
            )
        if rm.enable:
            raise RewardConfigError(
                "reward_model.enable=true loads reward_model.model.path as a scalar-head reward "
                "model, but reward_model.reward_manager=judge serves it as a generative judge; "
                "set reward_model.enable=false (the judge needs no reward-model worker)"
            )
        if config.custom_reward_function.path:
            raise RewardConfigError(
                "custom_reward_function.path is set, but reward_model.reward_manager=judge "
                "scores with the judge; to read the judge's answer yourself set "
                f"{key}.score_parser.path, or unset custom_reward_function.path"
            )
        for name in ("prompt_length", "response_length"):
            value = rm.rollout[name]
            if value < 1:
                raise RewardConfigError(
                    f"reward_model.rollout.{name}={value!r} must be an integer >= 1 (judge prompt / answer tokens)"
                )
        if rm.rollout.tensor_model_parallel_size > 1:
            raise RewardConfigError(
                "reward_model.rollout.tensor_model_parallel_size > 1 is not supported: the "
                "judge runs as one engine; set it to 1"
            )
        if not judge.timeout_s > 0:
            raise RewardConfigError(f"{key}.timeout_s={judge.timeout_s:g} must be a number of seconds > 0")
        if judge.score_pattern is not None:
            _check_pattern(judge.score_pattern, f"{key}.score_pattern")
        parser = judge.score_parser
        if parser.path:
            load_score_parser(parser.path, parser.name)  # fail now, not after the first generation
        return cls(
            model_path=str(rm.model.path),
            trust_remote_code=bool(rm.model.trust_remote_code),
            rollout=plain(rm.rollout),
            template=load_template(judge.prompt_template),
            system_prompt=judge.system_prompt or None,
            apply_chat_template=bool(judge.apply_chat_template),
            response_prefix=judge.response_prefix,
            score_pattern=judge.score_pattern,
            score_range=_score_range(list(judge.score_range)),
            parser_path=parser.path or None,
            parser_name=str(parser.name),
            timeout_s=float(judge.timeout_s),
        )


def _check_pattern(pattern: Any, key: str) -> None:
    if not isinstance(pattern, str):
        raise RewardConfigError(f"{key}={pattern!r} must be a regular expression (a string)")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise RewardConfigError(f"{key}={pattern!r} is not a valid regular expression: {exc}") from None
    if "score" not in regex.groupindex and regex.groups < 1:
        raise RewardConfigError(
            f"{key}={pattern!r} captures nothing; put the number in a group, e.g. "
            r"'Final grade: (\d+)' or '(?P<score>\d+)/10'"
        )
