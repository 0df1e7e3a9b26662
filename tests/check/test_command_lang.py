"""``attnkit check`` and ``attnkit check model`` speak the report's language on the command
line too: their help (``--lang zh`` on the line, else ``ATTNKIT_LANG``, since help is
printed before the arguments are parsed) and every usage error, in one line."""

from __future__ import annotations

import re

import pytest

from attnkit.cli import main

CJK = re.compile(r"[\u4e00-\u9fff]")


def _help(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", (["check"], ["check", "model"]))
def test_help_follows_the_environment_and_lang(command, capsys, monkeypatch, english_in):
    prog = "attnkit " + " ".join(command)
    english = _help(capsys, command + ["--help"])
    assert english.startswith(f"usage: {prog}") and "show this help message" in english
    assert CJK.findall(english) == ["中", "文"], english  # the name of the language only

    for argv, env in ((command + ["--help", "--lang", "zh"], None),
                      (command + ["--lang=zh", "--help"], None),
                      (command + ["--help"], "zh")):
        if env:
            monkeypatch.setenv("ATTNKIT_LANG", env)
        chinese = _help(capsys, argv)
        assert chinese.startswith(f"用法：{prog}"), chinese
        assert "位置参数" in chinese and "显示这段帮助并退出" in chinese
        assert not english_in(chinese.replace(prog, "")), english_in(chinese)
        assert max(len(CJK.findall(line)) * 2 + len(CJK.sub("", line))
                   for line in chinese.splitlines() if CJK.search(line)) <= 80 + 4
    # --lang en on the line wins over the environment
    assert _help(capsys, command + ["--help", "--lang", "en"]).startswith("usage:")


@pytest.mark.parametrize("argv", [
    ["check", "model", "--tiny", "llama", "--layers", "blocks.*"],
    ["check", "model"],
    ["check", "model", "--tiny", "falcon"],
    ["check", "model", "--seed", "-1"],
    ["check", "model", "--batch-size", "0"],
    ["check", "model", "--tiny", "llama", "--bogus"],
    ["check", "model", "--tiny", "llama", "--implementations", ","],
    ["check", "model", "nofile.py:make"],
    ["check", "model", "nofile.py:make", "--generate", "2"],
    ["check", "model", "--tiny"],
    ["check", "softmax"],
    ["check", "softmax", "nofile.py:f", "--causal"],
    ["check", "attention", "nofile.py:f", "--per-query-lens", "--convention", "none",
     "--causal"],
    ["check", "softmax", "nofile.py:f"],
    ["check", "softmax", "no_colon"],
])
def test_every_usage_error_is_one_line_in_the_language(argv, capsys, english_in):
    with pytest.raises(SystemExit) as exc:
        main(argv + ["--lang", "zh"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    prog = "attnkit check model" if argv[1] == "model" else "attnkit check"
    assert err.count("\n") == 1 and err.startswith(f"{prog}：错误："), err
    assert err.rstrip().endswith(f"（参见 {prog} --help）"), err
    assert not english_in(err.replace(prog, "")), (english_in(err), err)

    with pytest.raises(SystemExit):
        main(argv)
    english = capsys.readouterr().err
    assert english.startswith(f"{prog}: error: ") and not CJK.search(english), english


def test_a_missing_extra_is_said_in_the_language(capsys, monkeypatch, english_in):
    from attnkit.check.model import command

    def missing() -> None:
        raise ImportError("attnkit check model needs transformers, which is not installed: "
                          "pip install 'attnkit[transformers]'", name="transformers")

    monkeypatch.setattr(command, "require_transformers", missing)
    assert main(["check", "model", "--tiny", "llama", "--lang", "zh"]) == 2
    err = capsys.readouterr().err
    assert err == ("attnkit check model：错误：attnkit check model 需要 transformers，但它没有"
                   "安装：pip install 'attnkit[transformers]'\n"), err
    assert main(["check", "model", "--tiny", "llama"]) == 2
    assert capsys.readouterr().err == ("attnkit check model: error: attnkit check model needs "
                                       "transformers, which is not installed: pip install "
                                       "'attnkit[transformers]'\n")


def test_lang_takes_the_languages_of_the_catalogue():
    """``--lang`` of both commands offers :data:`LANGUAGES` itself, so a language is added
    by its folder of templates and its name there, not in each parser too."""
    import argparse

    from attnkit.check.catalogue import LANGUAGES
    from attnkit.check.model import command as model_command
    from attnkit.cli import build_parser, non_negative_int, positive_int

    check = build_parser()._subparsers._group_actions[0].choices["check"]  # type: ignore
    model = argparse.ArgumentParser()
    model_command.add_arguments(model, positive_int, non_negative_int)
    for parser in (check, model):
        (lang,) = [a for a in parser._actions if "--lang" in a.option_strings]
        assert lang.choices is LANGUAGES
