"""A reasoning model's reply, its thinking (a separate field, or inline in content) taken apart from its final
answer, the one place that does it; docs/upstream.md ("Reasoning models") has the shapes servers send."""

OPEN, CLOSE = "<think>", "</think>"
MODES = ("separate", "as-is")  # --thinking: the final answer graded, or content as the server sent it (references)


def separate(content: str, reasoning: str, finish_reason: str | None, mode: str = "separate") -> tuple[str, str, bool]:
    """(answer, thinking, truncated) of one reply: the final answer is graded, the thinking joins `reasoning` and
    content's; truncated: no answer, the token limit reached while thinking. "as-is" keeps content whole as the answer
    (as CL-bench, EvalScope and OpenAI Evals grade)."""
    answer, inline = (content, "") if mode == "as-is" else _split_inline(content)
    thinking = "\n\n".join(part for part in (reasoning.strip(), inline.strip()) if part)
    return answer, thinking, finish_reason == "length" and not answer.strip()


def _split_inline(content: str) -> tuple[str, str]:
    """(answer, thinking) of a content; thinking ends at the first `</think>`, as vLLM's DeepSeek-R1 parser splits."""
    head, closed, tail = content.partition(CLOSE)
    stripped = head.lstrip()
    if not closed and not stripped.startswith(OPEN):
        return content, ""
    # `<think>…</think>answer`, `…</think>answer` when the template opened the tag, or never closed: no answer
    return tail.lstrip(), stripped.removeprefix(OPEN) if stripped.startswith(OPEN) else head


def text_to_grade(row: dict, key: str, mode: str) -> str:
    """The text of `row[key]` that is graded: as written when infer separated it (a `thinking` field) or "as-is";
    else (upstream's rows) its final answer, so inline thinking is never shown to a judge or parsed for an answer."""
    text = row.get(key)
    text = text if isinstance(text, str) else ""
    return text if mode == "as-is" or "thinking" in row else _split_inline(text)[0]


def budget_advice(tokens: int | None) -> str:
    """What to do about answers that ran out of tokens while thinking, given the tokens they had (None: unknown)."""
    if not tokens:
        return "raise --max-tokens above the endpoint's own limit"
    return f"they needed more than {tokens:,} completion tokens: raise --max-tokens to {2 * tokens:,} or more"
