"""--help lists every benchmark's own flags: the chosen one's as usual, each other one's in a group
of its own (only without --bench); parsing is unchanged."""

import pytest

from evalpipe import cli
from evalpipe.stages import infer, judge

STAGES = {"infer": infer._add_args, "judge": judge._add_args}


def help_text(capsys, stage, *argv) -> str:
    with pytest.raises(SystemExit) as done:
        cli.parser_for(stage, "", STAGES[stage], [*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def groups(text: str) -> dict[str, str]:
    """Help text by group title ("usage" for what comes first)."""
    found, title = {"usage": ""}, "usage"
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            title = line[:-1]
            found[title] = ""
        else:
            found[title] += line + "\n"
    return found


def test_infer_help_without_bench_lists_the_other_benchmarks_flags(capsys):
    shown = groups(help_text(capsys, "infer"))
    coin_flip = shown["coin_flip options (with --bench coin_flip)"]
    assert "--fewshot FEWSHOT" in coin_flip and "--fewshot-seed" in coin_flip and "--fewshot-data" in coin_flip
    error_recovery = shown["error_recovery options (with --bench error_recovery)"]
    for flag in (
        "--reasoning-role",
        "--final-answer-role",
        "--mistake-notice",
        "--mistake-notice-ir-only",
        "--chat-compat",
    ):
        assert flag in error_recovery
    assert "--model" not in coin_flip + error_recovery  # the flags every benchmark has are listed once
    assert not any("clbench options" in title for title in shown)  # the default benchmark's are in place already


def test_judge_help_without_bench_lists_the_other_benchmarks_flags(capsys):
    text = help_text(capsys, "judge")
    shown = groups(text)
    assert "--parse {evalscope,strict,lenient}" in shown["coin_flip options (with --bench coin_flip)"]
    assert "--judge-prompt" in text and "--error-analysis" in text  # clbench's own, in their usual place
    assert not any(title.startswith("error_recovery options") for title in shown)  # it has no judge flags


def test_help_with_bench_shows_that_benchmarks_flags(capsys):
    text = help_text(capsys, "infer", "--bench", "coin_flip")
    assert "--fewshot FEWSHOT" in text and "options (with --bench" not in text and "--reasoning-role" not in text
    text = help_text(capsys, "judge", "--bench=coin_flip")
    assert (
        "--parse {evalscope,strict,lenient}" in text
        and "--judge-prompt" not in text
        and "options (with --bench" not in text
    )


def test_another_benchmarks_flag_is_still_an_error_without_its_bench(capsys):
    with pytest.raises(SystemExit) as done:
        cli.parser_for("infer", "", infer._add_args, ["--model", "m", "--fewshot", "2"])
    assert done.value.code == 2 and "unrecognized arguments: --fewshot 2" in capsys.readouterr().err
    _, args = cli.parser_for("infer", "", infer._add_args, ["--model", "m", "--bench", "coin_flip", "--fewshot", "0"])
    assert args.fewshot == 0


@pytest.mark.e2e
@pytest.mark.parametrize("script", ["score", "aggregate"])
def test_stages_without_benchmark_flags_show_no_extra_groups(stage, script):
    proc = stage(script, "--help", check=0)
    assert "options (with --bench" not in proc.stdout
