"""A reasoning model's reply, its thinking taken apart from its final answer (what is graded): the one place that
does it. Servers hand the thinking back hidden (only usage's reasoning_tokens: OpenAI), in a separate field
(message.reasoning_content or .reasoning: vLLM --reasoning-parser, llama.cpp, DeepSeek's API, routers), or
inline in content (raw vLLM, llama.cpp or Ollama serving R1 distills, Qwen3, QwQ): `<think>…</think>answer`,
`…</think>answer` when the chat template opened the tag, or an unclosed `<think>` when the budget ran out.
Inline thinking ends at the first `</think>`, as vLLM's DeepSeek-R1 reasoning parser splits it. A reply with no
final answer that stopped at the token limit (`finish_reason: length`) ran out of budget while thinking.
"""

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"
MODES = ("separate", "as-is")  # --thinking: the final answer graded, or content as the server sent it (references)


@dataclass(frozen=True)
class Reply:
    answer: str  # the final answer: what is graded
    thinking: str  # the thinking, from the reasoning field and from content ("" when none)
    truncated: bool  # no final answer: the token limit was reached while thinking


def separate(content: str, reasoning: str = "", finish_reason: str | None = None, mode: str = "separate") -> Reply:
    """The final answer and the thinking of one reply (`reasoning`: the server's reasoning field). Mode "as-is"
    keeps content whole as the answer (what CL-bench, EvalScope and OpenAI Evals grade)."""
    answer, inline = content, ""
    if mode != "as-is":
        answer, inline = _split_inline(content)
    thinking = "\n\n".join(part for part in (reasoning.strip(), inline.strip()) if part)
    truncated = finish_reason == "length" and not answer.strip()
    return Reply(answer, thinking, truncated)


def _split_inline(content: str) -> tuple[str, str]:
    """(answer, thinking) of a content that may hold inline thinking."""
    head, closed, tail = content.partition(CLOSE)
    if closed:  # `<think>…</think>answer`, or `…</think>answer` when the template opened the tag
        return tail.lstrip(), _without_open(head)
    if content.lstrip().startswith(OPEN):  # never closed: no final answer
        return "", _without_open(content)
    return content, ""


def _without_open(text: str) -> str:
    stripped = text.lstrip()
    return stripped[len(OPEN) :] if stripped.startswith(OPEN) else text


def text_to_grade(row: dict, key: str, mode: str) -> str:
    """The text of `row[key]` that is graded: as written when infer separated it (the row has a `thinking` field)
    or with mode "as-is"; else (rows of upstream's infer or of an older version) its final answer, so that
    thinking written inline is never shown to a judge or parsed for an answer."""
    text = row.get(key)
    text = text if isinstance(text, str) else ""
    if mode == "as-is" or "thinking" in row:
        return text
    return _split_inline(text)[0]


def budget_advice(tokens: int | None) -> str:
    """What to do about answers that ran out of tokens while thinking, given the completion tokens they had
    (None or 0: not known, the endpoint's own limit)."""
    if not tokens:
        return "raise --max-tokens above the endpoint's own limit"
    return f"they needed more than {tokens:,} completion tokens: raise --max-tokens to {2 * tokens:,} or more"
