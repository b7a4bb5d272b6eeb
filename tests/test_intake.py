"""Intake: a submit request is validated and rendered into a JobSpec before the store sees it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from herder.core.errors import ConfigError, InputError
from herder.core.model import JobSpec
from herder.core.settings.job_types import JobTypeSection
from herder.core.settings.loading import Config, load_config
from herder.services.intake import parse_assignments, parse_payload, resolve
from herder.wire.jobs import SubmitBody

CONFIG = """
[defaults]
priority = 50
weight = "light"
max_attempts = 4
timeout = "1h"
backoff_base = "5s"
backoff_max = "5m"

[job_types.greet]
command = ["echo", "hello {name}", "n={count}"]
env = { WHO = "{name}", COUNT = "{count}", FIXED = "plain" }
workdir = "{repo}"
weight = "heavy"
priority = 7
max_attempts = 2
timeout = "30m"
backoff_base = "1s"
backoff_max = "8s"

[job_types.plain]
command = ["true"]

[job_types.agent]
command = ["cat", "{prompt_file}"]
prompt_file = "prompts/task.md"
env = { PROMPT = "{prompt}", ISSUE = "{issue}" }
export = ["issue", "repo"]

[job_types.say]
shell = true
command = "printf '%s' {msg} > said.txt"
option_fields = ["msg"]   # printf's format comes first: any text, '-x' too, is data

[job_types.shellprompt]
shell = true
command = "printf '%s' {prompt} > said.txt"
prompt_file = "prompts/task.md"

[job_types.braces]
command = ["echo", "{{literal}}", "{name}"]

[job_types.missing]
command = ["no-such-program-for-herder-tests"]

[job_types.bypath]
command = ["./tools/run.sh", "{name}"]
"""

PROMPT = "Fix issue #42.\nDon't touch `main`; keep $HOME and \"quotes\" as they are.\n"


@pytest.fixture
def config(tmp_path, monkeypatch) -> Config:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "task.md").write_text(PROMPT)
    (tmp_path / "repo").mkdir()
    path = tmp_path / "herder.toml"
    path.write_text(CONFIG.replace("\nworkdir = \"{repo}\"\n",
                                   f"\nworkdir = \"{{repo}}\"\nworkdir_base = \"{tmp_path}\"\n"))
    return load_config(path)


def request(job_type: str | None = None, command=None, **fields) -> SubmitBody:
    """Unvalidated, so `resolve`'s own checks are what these tests see."""
    return SubmitBody.model_construct(job_type=job_type, command=command, **fields)


def rejected(config: Config, req: SubmitBody) -> InputError:
    with pytest.raises(InputError) as raised:
        resolve(config, req)
    return raised.value


# -- rendering --------------------------------------------------------------------------------


def test_placeholders_fill_command_env_and_workdir_from_the_payload(config, tmp_path):
    repo = tmp_path / "repo"
    spec = resolve(config, request("greet", payload={"name": "Ada Lovelace", "count": 3,
                                                     "repo": str(repo)}))
    assert spec.command == ("echo", "hello Ada Lovelace", "n=3")
    assert spec.env == {"WHO": "Ada Lovelace", "COUNT": "3", "FIXED": "plain",
                        "HERDER_WORKDIR_BASE": str(tmp_path)}
    assert spec.workdir == str(repo.resolve())
    assert spec.job_type == "greet"
    assert spec.shell is False
    assert spec.payload == {"name": "Ada Lovelace", "count": 3, "repo": str(repo)}


@pytest.mark.parametrize(
    ("value", "text"),
    [(3, "3"), (True, "true"), (None, "null"), (1.5, "1.5"), ([1, "a"], '[1, "a"]'),
     ({"k": 1}, '{"k": 1}'), ("", "")],
)
def test_non_string_payload_values_render_as_json(config, tmp_path, value, text):
    spec = resolve(config, request("greet", payload={"name": "x", "count": value,
                                                     "repo": str(tmp_path)}))
    assert spec.command[2] == f"n={text}"
    assert spec.env["COUNT"] == text


def test_settings_come_from_request_then_job_type_then_defaults(config, tmp_path):
    payload = {"name": "x", "count": 1, "repo": str(tmp_path)}
    typed = resolve(config, request("greet", payload=payload))
    assert (typed.weight, typed.priority, typed.max_attempts, typed.timeout_seconds) == (
        "heavy", 7, 2, 1800.0)
    assert (typed.backoff_base_seconds, typed.backoff_max_seconds) == (1.0, 8.0)
    overridden = resolve(config, request("greet", payload=payload, weight="light", priority=-3,
                                         max_attempts=9, timeout_seconds=12.5,
                                         env={"WHO": "override", "EXTRA": "1"}))
    assert (overridden.weight, overridden.priority, overridden.max_attempts,
            overridden.timeout_seconds) == ("light", -3, 9, 12.5)
    assert overridden.env["WHO"] == "override"
    assert overridden.env["EXTRA"] == "1"
    plain = resolve(config, request("plain"))
    assert (plain.weight, plain.priority, plain.max_attempts, plain.timeout_seconds) == (
        "light", 50, 4, 3600.0)
    assert (plain.backoff_base_seconds, plain.backoff_max_seconds) == (5.0, 300.0)


def test_adhoc_command_runs_here_with_the_request_env(config, tmp_path):
    spec = resolve(config, request(command=["echo", "{not a placeholder}"], env={"A": "1"},
                                   dedup_key="k1", affinity="box"))
    assert spec.job_type == "adhoc"
    assert spec.command == ("echo", "{not a placeholder}")
    assert spec.env == {"A": "1"}
    assert spec.workdir == str(tmp_path.resolve())
    assert (spec.dedup_key, spec.affinity) == ("k1", "box")


def test_literal_braces_are_escaped_by_doubling(config):
    spec = resolve(config, request("braces", payload={"name": "n"}))
    assert spec.command == ("echo", "{literal}", "n")


@pytest.mark.parametrize(
    ("job_type", "where"),
    [("greet", "job_types.greet.command"), ("agent", "job_types.agent.env.ISSUE")],
)
def test_missing_payload_field_names_payload_dot_field(config, job_type, where):
    error = rejected(config, request(job_type, payload={"count": 1}))
    missing = "name" if job_type == "greet" else "issue"
    assert error.field == f"payload.{missing}"
    assert where in error.problem
    assert f"-p {missing}=" in str(error)


def test_missing_workdir_field_names_payload_dot_field(config):
    error = rejected(config, request("greet", payload={"name": "x", "count": 1}))
    assert error.field == "payload.repo"
    assert "job_types.greet.workdir" in error.problem


@pytest.mark.parametrize("template", ["{name.__class__}", "{name[0]}", "{name!r}",
                                      "{name:>10}", "{}"])
def test_placeholders_other_than_plain_names_are_a_config_error(tmp_path, template):
    path = tmp_path / "herder.toml"
    path.write_text(f'[job_types.attr]\ncommand = ["echo", "{template}"]\n')
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert "job_types.attr.command" in raised.value.field
    assert "not a plain name" in raised.value.problem


def test_an_unclosed_placeholder_is_a_config_error(tmp_path):
    path = tmp_path / "herder.toml"
    path.write_text('[job_types.unclosed]\ncommand = ["echo", "{name"]\n')
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert "job_types.unclosed.command" in raised.value.field
    assert "bad template" in raised.value.problem


def test_prompt_file_gives_its_text_as_prompt_and_its_path_as_prompt_file(config, tmp_path):
    spec = resolve(config, request("agent", payload={"issue": 42, "repo": "/src/app"}))
    prompt_path = str((tmp_path / "prompts" / "task.md").resolve())
    assert spec.command == ("cat", prompt_path)
    assert spec.env["PROMPT"] == PROMPT
    assert spec.env["ISSUE"] == "42"


def test_export_sets_herder_payload_variables(config):
    spec = resolve(config, request("agent", payload={"issue": 42, "repo": "/src/app",
                                                     "other": "x"}))
    assert spec.env["HERDER_PAYLOAD_ISSUE"] == "42"
    assert spec.env["HERDER_PAYLOAD_REPO"] == "/src/app"
    assert "HERDER_PAYLOAD_OTHER" not in spec.env


def test_missing_exported_field_names_it(config):
    error = rejected(config, request("agent", payload={"issue": 42}))
    assert error.field == "payload.repo"


def test_prompt_file_that_vanished_after_loading_is_an_input_error(config, tmp_path):
    (tmp_path / "prompts" / "task.md").unlink()
    error = rejected(config, request("agent", payload={"issue": 1, "repo": "r"}))
    assert error.field == "job_types.agent.prompt_file"


# -- shell job types --------------------------------------------------------------------------


def run_rendered(spec: JobSpec, cwd: Path) -> None:
    """The script as the job runs it: its own env (the payload's values) and nothing else."""
    subprocess.run(spec.command, cwd=cwd, check=True, timeout=10,
                   env={**spec.env, "PATH": os.defpath, "HOME": "/home/u"})


@pytest.mark.parametrize(
    "attack",
    [
        "x; touch pwned",
        "x && touch pwned",
        "$(touch pwned)",
        "`touch pwned`",
        "'; touch pwned; echo '",
        "x\ntouch pwned",
        "x | touch pwned",
        "> pwned",
    ],
)
def test_shell_job_type_quotes_payload_values(config, tmp_path, attack):
    """An injection attempt stays one quoted word: run it and look for its side effect."""
    spec = resolve(config, request("say", payload={"msg": attack}))
    assert spec.shell is True
    assert spec.command[:2] == ("/bin/sh", "-c")
    run_rendered(spec, tmp_path)
    assert not (tmp_path / "pwned").exists(), spec.command
    assert (tmp_path / "said.txt").read_text() == attack


def test_shell_job_type_quotes_the_prompt_text_too(config, tmp_path):
    spec = resolve(config, request("shellprompt"))
    run_rendered(spec, tmp_path)
    assert (tmp_path / "said.txt").read_text() == PROMPT


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                    max_size=40))
@example(text="-n $(touch pwned) ${IFS}")
def test_shell_quoting_round_trips_any_text(config, tmp_path, text):
    """Any text, a leading '-' included (the field opts out), comes out as it went in."""
    spec = resolve(config, request("say", payload={"msg": text}))
    run_rendered(spec, tmp_path)
    assert (tmp_path / "said.txt").read_bytes() == text.encode()


def test_argv_job_type_keeps_a_value_with_spaces_as_one_argument(config, tmp_path):
    spec = resolve(config, request("greet", payload={"name": "a; touch pwned", "count": 1,
                                                     "repo": str(tmp_path)}))
    out = subprocess.run(spec.command, capture_output=True, text=True, check=True, timeout=10)
    assert out.stdout == "hello a; touch pwned n=1\n"
    assert not (tmp_path / "pwned").exists()


# -- what is rejected -------------------------------------------------------------------------


def test_unknown_job_type_lists_the_known_ones(config):
    error = rejected(config, request("nope"))
    assert error.field == "job_type"
    assert "'nope'" in error.problem
    assert "greet" in str(error) and "plain" in str(error)


def test_unknown_weight_lists_the_known_ones(config):
    error = rejected(config, request(command=["true"], weight="colossal"))
    assert error.field == "weight"
    assert "'colossal'" in error.problem
    assert "heavy, light" in str(error)


def test_job_type_with_a_command_too_is_rejected(config):
    assert rejected(config, request("plain", command=["echo"])).field == "command"


@pytest.mark.parametrize("command", [None, []])
def test_nothing_to_run_is_rejected(config, command):
    assert rejected(config, request(command=command)).field == "command"


def test_command_not_on_path_is_rejected(config):
    error = rejected(config, request(command=["no-such-program-for-herder-tests", "-x"]))
    assert error.field == "command"
    assert "not found on PATH" in error.problem
    assert rejected(config, request("missing")).field == "command"


def test_command_by_path_must_be_an_executable_file(config, tmp_path):
    error = rejected(config, request("bypath", payload={"name": "n"}))
    assert error.field == "command"
    assert "'./tools/run.sh' is not an executable file" in error.problem
    script = tmp_path / "tools" / "run.sh"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\necho $1\n")
    assert rejected(config, request("bypath", payload={"name": "n"})).field == "command"
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    spec = resolve(config, request("bypath", payload={"name": "n"}))
    assert spec.command == ("./tools/run.sh", "n")
    error = rejected(config, request(command=[str(tmp_path / "tools")]))
    assert error.field == "command"


def test_relative_command_path_is_checked_in_the_workdir(config, tmp_path):
    (tmp_path / "repo" / "go.sh").write_text("#!/bin/sh\n")
    (tmp_path / "repo" / "go.sh").chmod(0o755)
    assert rejected(config, request(command=["./go.sh"])).field == "command"
    spec = resolve(config, request(command=["./go.sh"], workdir=str(tmp_path / "repo")))
    assert spec.workdir == str((tmp_path / "repo").resolve())


def test_command_is_looked_up_on_the_jobs_own_path(config, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "herder-test-tool").write_text("#!/bin/sh\n")
    (bin_dir / "herder-test-tool").chmod(0o755)
    assert rejected(config, request(command=["herder-test-tool"])).field == "command"
    # A submitted PATH is refused (issue 23: it picks the program a fixed argv runs); the
    # job type's own env in herder.toml may set it.
    assert rejected(config, request(command=["herder-test-tool"],
                                    env={"PATH": str(bin_dir)})).field == "env.PATH"
    tool = JobTypeSection(command=["herder-test-tool"], env={"PATH": str(bin_dir)})
    typed = Config(msgspec.structs.replace(
        config.settings, job_types={**config.settings.job_types, "tool": tool}), config.path)
    spec = resolve(typed, request("tool"))
    assert spec.command == ("herder-test-tool",) and spec.env["PATH"] == str(bin_dir)


def test_no_check_skips_the_command_and_workdir_checks(config, tmp_path):
    spec = resolve(config, request(command=["no-such-program-for-herder-tests"],
                                   workdir=str(tmp_path / "not-yet")), check_command=False)
    assert spec.command == ("no-such-program-for-herder-tests",)
    assert spec.workdir == str((tmp_path / "not-yet").resolve())


def test_workdir_must_exist(config, tmp_path):
    error = rejected(config, request(command=["true"], workdir=str(tmp_path / "nope")))
    assert error.field == "workdir"
    assert "is not a directory" in error.problem
    (tmp_path / "file").write_text("")
    assert rejected(config, request(command=["true"], workdir=str(tmp_path / "file"))).field \
        == "workdir"
    templated = rejected(config, request("greet", payload={"name": "x", "count": 1,
                                                           "repo": str(tmp_path / "gone")}))
    assert templated.field == "workdir"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": -1}, "max_attempts"),
        ({"max_attempts": 2**31}, "max_attempts"),
        ({"priority": 2**31}, "priority"),
        ({"priority": -(2**31) - 1}, "priority"),
        ({"timeout_seconds": 0}, "timeout"),
        ({"timeout_seconds": -5}, "timeout"),
        ({"dedup_key": "  "}, "dedup_key"),
        ({"payload": {"x": float("nan")}}, "payload"),
        ({"payload": {"x": [float("inf")]}}, "payload"),
        ({"payload": {"x": "a\x00b"}}, "payload"),
        ({"payload": {"a\x00": 1}}, "payload"),
        ({"payload": {"x": ["\udc00"]}}, "payload"),
        ({"payload": {"x": object()}}, "payload"),
        ({"payload": {"x": "y" * 1_000_001}}, "payload"),
    ],
)
def test_bad_fields_are_rejected_by_name(config, fields, field):
    assert rejected(config, request(command=["true"], **fields)).field == field


def test_extreme_but_valid_values_are_accepted(config):
    spec = resolve(config, request(command=["true"], priority=-(2**31), max_attempts=2**31 - 1,
                                   payload={"text": "\\u0000 is only text", "n": 10**30}))
    assert (spec.priority, spec.max_attempts) == (-(2**31), 2**31 - 1)


# -- parsing -p and --payload ------------------------------------------------------------------


def test_assignments_keep_json_types():
    assert parse_assignments([
        "n=42", "yes=true", "no=false", "s=abc", "f=1.5", "z=null", 'q="42"', 'obj={"a": 1}',
        "arr=[1, 2]", "empty=", "eq=a=b", " spaced =x", "neg=-3", "nan=NaN", "inf=Infinity",
        "text=hello world",
    ]) == {
        "n": 42, "yes": True, "no": False, "s": "abc", "f": 1.5, "z": None, "q": "42",
        "obj": {"a": 1}, "arr": [1, 2], "empty": "", "eq": "a=b", "spaced": "x", "neg": -3,
        "nan": "NaN", "inf": "Infinity", "text": "hello world",
    }
    parsed = parse_assignments(["n=42", "t=true", "s=abc"])
    assert type(parsed["n"]) is int
    assert type(parsed["t"]) is bool
    assert type(parsed["s"]) is str


def test_later_assignment_wins():
    assert parse_assignments(["a=1", "a=2"]) == {"a": 2}


@pytest.mark.parametrize("item", ["novalue", "=x", "  =x", ""])
def test_assignment_without_key_is_rejected(item):
    with pytest.raises(InputError) as raised:
        parse_assignments([item])
    assert raised.value.field == "-p"


def test_payload_parses_a_json_object():
    assert parse_payload('{"issue": 42, "labels": ["bug"], "ok": true}') == {
        "issue": 42, "labels": ["bug"], "ok": True}


@pytest.mark.parametrize(
    "text", ["[1, 2]", "42", '"text"', "null", "true", "{bad", "", '{"a": NaN}',
             '{"a": Infinity}', "{'a': 1}"],
)
def test_payload_that_is_not_a_json_object_is_rejected(text):
    with pytest.raises(InputError) as raised:
        parse_payload(text)
    assert raised.value.field == "payload"
    assert raised.value.fix is not None


def test_payload_round_trips_through_json_unchanged(config):
    payload = {"unicode": "naïve ☃", "nested": {"list": [1, 2.5, None, False]}}
    spec = resolve(config, request(command=["true"], payload=parse_payload(json.dumps(payload))))
    assert spec.payload == payload


# -- payload values stay values (issue 23) ----------------------------------------------------

VALUES = """
[job_types.tests]
command = ["pytest", "-q", "{path}", ["--maxfail", "{maxfail}"], ["--tb={tb}"]]

[job_types.flags]
command = ["ls", "{extra}", "{path}"]
option_fields = ["extra"]

[job_types.prompted]
command = ["cat", "{prompt}"]
prompt_file = "dash.md"

[job_types.based]
command = ["true"]
workdir = "{repo}"
workdir_base = "BASE"

[job_types.heredoc]
shell = true
command = "cat <<EOF > said.txt\\nTitle: {title}\\nEOF\\nprintf '%s' {title} >> said.txt"

[job_types.shellflag]
shell = true
command = "ls {path} --color={when}"

[job_types.quoted]
shell = true
command = 'pytest "{path}"'

[job_types.joined]
command = ["pytest", "{a}{b}", ["--tb={tb}"]]

[job_types.shelljoined]
shell = true
command = 'pytest {a}{b}'

[job_types.words]
shell = true
command = '''printf '%s\\n' "{a}" {a}{b} "{a}"-x "{a} t" x"{a}" "--k={a}" {o}{a} \\
  "$(printf '%s' "{b}")" > words.txt'''
option_fields = ["o"]

[job_types.contexts]
shell = true
command = '''
printf '%s|' {v} "dq {v}" x{v}y "$(printf '%s' {v})" > out.txt
cat <<EOF >> out.txt
hd {v} ${{HOME}}
EOF'''
option_fields = ["v"]
"""


@pytest.fixture
def values(tmp_path, monkeypatch) -> Config:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dash.md").write_text("--- front matter of the operator's own prompt\n")
    (tmp_path / "base" / "app").mkdir(parents=True)
    path = tmp_path / "herder.toml"
    path.write_text(VALUES.replace("BASE", str(tmp_path / "base")))
    return load_config(path)


@pytest.mark.parametrize(("job_type", "payload", "field"), [
    ("tests", {"path": "--basetemp=/home"}, "payload.path"),
    ("tests", {"path": "tests", "maxfail": "-1"}, "payload.maxfail"),
    ("tests", {"path": -3}, "payload.path"),
    ("flags", {"extra": "-la", "path": "-R"}, "payload.path"),
    ("shellflag", {"path": "--hyperlink", "when": "never"}, "payload.path"),
    ("quoted", {"path": "--basetemp=/home"}, "payload.path"),
    ("joined", {"a": "", "b": "--basetemp=/home"}, "payload.a"),
    ("joined", {"a": "-", "b": "-basetemp=/home"}, "payload.a"),
    ("shelljoined", {"a": "", "b": "--basetemp=/home"}, "payload.a"),
    ("words", {"a": "", "b": "x", "o": ""}, "payload.a"),
    ("words", {"a": "-v t", "b": "x", "o": ""}, "payload.a"),
    ("words", {"a": "a", "b": "-x", "o": ""}, "payload.b"),
])
def test_a_value_that_would_be_an_option_is_refused_at_submit(values, job_type, payload, field):
    """A placeholder that is a whole argument: `--basetemp=/home` would make pytest delete
    /home. Nothing is enqueued (resolve raises before the store)."""
    error = rejected(values, request(job_type, payload=payload))
    assert error.field == field
    assert "starts with '-'" in error.problem and "option_fields" in str(error)


def test_an_embedded_value_an_opted_out_field_and_herders_prompt_may_start_with_a_dash(values):
    spec = resolve(values, request("tests", payload={"path": "t", "tb": "-short"}),
                   check_command=False)
    assert spec.command == ("pytest", "-q", "t", "--tb=-short")
    spec = resolve(values, request("flags", payload={"extra": "-la", "path": "src"}),
                   check_command=False)
    assert spec.command == ("ls", "-la", "src")
    spec = resolve(values, request("prompted"), check_command=False)
    assert spec.command[1].startswith("--- front matter")
    spec = resolve(values, request("shellflag", payload={"path": "src", "when": "-x"}),
                   check_command=False)
    assert spec.env["HERDER_P_WHEN"] == "-x"


def test_a_word_that_payload_text_opens_is_checked_and_one_it_does_not_open_is_not(values):
    """Quoted (`"{path}"`, the form the docs recommend) or joined (`{a}{b}` with a empty),
    the program still receives one argument `--basetemp=/home`: the rule is about where
    the argument starts, not about quoting. `x{a}` and `--tb={tb}` start with the job
    type's own text."""
    spec = resolve(values, request("joined", payload={"a": "t", "b": "-x", "tb": "-short"}),
                   check_command=False)
    assert spec.command == ("pytest", "t-x", "--tb=-short")
    spec = resolve(values, request("quoted", payload={"path": "tests/-x"}), check_command=False)
    assert spec.env["HERDER_P_PATH"] == "tests/-x"


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=st.sampled_from(["", "-", "--x", "a", " -a", "-a b", "a-"]),
       b=st.sampled_from(["", "-", "--basetemp=/home", "b"]),
       o=st.sampled_from(["", "-o", "o"]))
def test_no_argument_the_payload_opens_reaches_a_real_shell_as_an_option(values, tmp_path, a, b, o):
    """Whatever the values, either the submit is refused naming the field or no argument
    that payload text opens starts with '-' (only `{o}`, an option field, may; and
    `"--k={a}"` is the job type's own option)."""
    try:
        spec = resolve(values, request("words", payload={"a": a, "b": b, "o": o}),
                       check_command=False)
    except InputError as error:
        assert error.field in ("payload.a", "payload.b")
        assert "starts with '-'" in error.problem
        return
    run_rendered(spec, tmp_path)
    words = (tmp_path / "words.txt").read_text().split("\n")[:-1]
    opened = [word for index, word in enumerate(words) if index not in (4, 5, 6)]
    assert not [word for word in opened if word.startswith("-")], words
    assert words[6] == o + a


@pytest.mark.parametrize("repo", ["../../../../root", "/root", "app/../../x", "app/../../base2",
                                  "//etc"])
def test_a_templated_workdir_that_leads_out_of_its_base_is_refused(values, tmp_path, repo):
    error = rejected(values, request("based", payload={"repo": repo}))
    assert error.field == "workdir"
    assert "must stay inside the workdir_base" in error.problem


@pytest.mark.parametrize("repo", ["app", "BASE/app", "./app/", "app/x/.."])
def test_a_templated_workdir_inside_its_base_is_normalised(values, tmp_path, repo):
    base = tmp_path / "base"
    spec = resolve(values, request("based", payload={"repo": repo.replace("BASE", str(base))}))
    assert spec.workdir == str(base / "app")
    assert spec.env["HERDER_WORKDIR_BASE"] == str(base)


def test_a_symlink_inside_the_base_that_points_out_is_refused(values, tmp_path):
    (tmp_path / "base" / "out").symlink_to(tmp_path)
    error = rejected(values, request("based", payload={"repo": "out"}))
    assert error.field == "workdir" and "through a symbolic link" in error.problem


def test_a_submitter_cannot_set_what_herder_sets_from_the_job_type(values):
    for name in ("HERDER_WORKDIR_BASE", "HERDER_P_TITLE"):
        error = rejected(values, request("heredoc", payload={"title": "t"}, env={name: "/"}))
        assert error.field == f"env.{name}"


@pytest.mark.parametrize("title", [
    "$(id>pwned)", "`id>pwned`", "${IFS}$(touch pwned)", "EOF\ntouch pwned\nEOF",
    "\\$(touch pwned)", "'; touch pwned; '", "\"$(touch pwned)\"",
])
def test_a_title_in_an_unquoted_heredoc_is_text_not_code(values, tmp_path, title):
    """Issue 23's attack: a signed webhook's title `$(id>...)` ran `id` through
    `cat <<EOF\\n{title}\\nEOF`. The value now reaches the script as $HERDER_P_TITLE,
    which the shell expands but never parses: a real /bin/sh, and no marker file."""
    spec = resolve(values, request("heredoc", payload={"title": title}))
    assert title not in spec.command[2]
    assert spec.env["HERDER_P_TITLE"] == title
    run_rendered(spec, tmp_path)
    assert not (tmp_path / "pwned").exists(), spec.command
    assert (tmp_path / "said.txt").read_text() == f"Title: {title}\n{title}"


def test_shell_references_by_where_the_placeholder_stands(values):
    spec = resolve(values, request("contexts", payload={"v": "x"}), check_command=False)
    assert spec.command[2] == (
        'printf \'%s|\' "${HERDER_P_V}" "dq ${HERDER_P_V}" x"${HERDER_P_V}"y '
        '"$(printf \'%s\' "${HERDER_P_V}")" > out.txt\ncat <<EOF >> out.txt\n'
        'hd ${HERDER_P_V} ${HOME}\nEOF')
    assert spec.env["HERDER_P_V"] == "x"


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                    max_size=40))
@example(text="$(touch pwned)\nEOF\ntouch pwned\n`touch pwned` \"'\\\n")
def test_any_value_is_data_as_a_word_in_quotes_in_a_substitution_and_in_a_heredoc(
        values, tmp_path, text):
    spec = resolve(values, request("contexts", payload={"v": text}), check_command=False)
    run_rendered(spec, tmp_path)
    assert not (tmp_path / "pwned").exists()
    substituted = text.rstrip("\n")  # $(...) drops trailing newlines, whatever they hold
    assert (tmp_path / "out.txt").read_bytes() == (
        f"{text}|dq {text}|x{text}y|{substituted}|hd {text} /home/u\n".encode())
