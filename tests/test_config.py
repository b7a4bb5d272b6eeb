"""herder.toml: the sample loads, durations parse, every error names file, line and key."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from support.cli import ok, run_herder

from herder.core.errors import ConfigError, InputError
from herder.core.settings.fields import parse_duration
from herder.core.settings.fleet import ESCALATION_CHAIN
from herder.core.settings.loading import Config, load_config, sample_config
from herder.core.settings.sections import Settings
from herder.core.urls import DEFAULT_DB
from herder.runtime.endings import OutcomeRules

MARK = "# <-"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No HERDER_* from the outside, and a cwd without a herder.toml."""
    monkeypatch.delenv("HERDER_DB", raising=False)
    monkeypatch.delenv("HERDER_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)


def write(tmp_path: Path, text: str, name: str = "herder.toml") -> Path:
    path = (tmp_path / name).resolve()
    path.write_text(text)
    return path


def marked_line(text: str) -> int:
    """1-based number of the one line carrying the `# <-` marker."""
    found = [n for n, line in enumerate(text.splitlines(), 1) if MARK in line]
    assert len(found) == 1, found
    return found[0]


def refused(path: Path) -> str:
    """The message of the ConfigError that loading `path` raises."""
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    return str(raised.value)


# -- the sample -------------------------------------------------------------------------------


def test_sample_written_by_init_loads_with_the_documented_defaults(tmp_path):
    ok(run_herder("init", cwd=tmp_path))
    path = tmp_path / "herder.toml"
    assert path.read_text() == sample_config()
    config = load_config(path)
    assert config.path == path.resolve()
    defaults = Settings()
    # "Every key is optional; the values shown are the defaults."
    assert config.settings.runtime == defaults.runtime
    assert config.settings.defaults == defaults.defaults
    assert config.settings.weights == defaults.weights
    assert config.settings.herder.log_dir == defaults.herder.log_dir
    assert sorted(config.settings.job_types) == ["hello", "pytest"]
    hello = config.settings.job_types["hello"]
    assert hello.env == {"WHO": "{name}"}
    assert hello.timeout == 60.0
    assert config.settings.job_types["pytest"].max_attempts == 2
    # The sample's relative db lives next to the file, wherever herder runs from.
    assert config.db_url() == f"sqlite:///{tmp_path.resolve() / 'herder.db'}"


def sample_uncommented(first: str, stop: str) -> str:
    """The sample with its lines from `first` to the one starting with `stop` uncommented."""
    lines = sample_config().splitlines()
    start = lines.index(first)
    end = next(i for i, line in enumerate(lines) if line.startswith(stop))
    return "\n".join(lines[:start] + [line.removeprefix("# ") for line in lines[start:end]]
                     + lines[end:]) + "\n"


def test_commented_claude_example_in_the_sample_loads_once_uncommented(tmp_path):
    path = write(tmp_path, sample_uncommented("# [job_types.claude-issue]", "# The same agent"))
    with pytest.raises(ConfigError, match=r"job_types\.claude-issue\.prompt_file"):
        load_config(path)
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "issue.md").write_text("Fix issue {issue}\n")
    job_type = load_config(path).settings.job_types["claude-issue"]
    assert job_type.export == ["issue", "repo"]
    assert job_type.timeout == 7200.0
    assert job_type.priority == 10


def test_commented_workspace_example_in_the_sample_loads_once_uncommented(tmp_path):
    path = write(tmp_path, sample_uncommented("# [job_types.fix-issue]", "# --- A fleet"))
    job_type = load_config(path).settings.job_types["fix-issue"]
    assert job_type.command[-1] == ["--model", "{model}"]
    assert (job_type.prompt_from, job_type.workspace and job_type.workspace.mode) == (
        "workspace", "worktree")


def test_no_config_file_means_defaults(tmp_path):
    config = load_config()
    assert config.path is None
    assert config.settings == Settings()
    assert config.base_dir == Path.cwd()


def test_explicit_config_that_does_not_exist_is_an_error(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"missing\.toml: file not found"):
        load_config(tmp_path / "missing.toml")
    monkeypatch.setenv("HERDER_CONFIG", str(tmp_path / "also-missing.toml"))
    with pytest.raises(ConfigError, match=r"also-missing\.toml: file not found"):
        load_config()


def test_herder_config_env_names_the_file(tmp_path, monkeypatch):
    path = write(tmp_path, "[runtime]\nconcurrency = 7\n", "elsewhere.toml")
    monkeypatch.setenv("HERDER_CONFIG", str(path))
    assert load_config().settings.runtime.concurrency == 7


def test_custom_weights_are_usable_by_defaults_and_job_types(tmp_path):
    path = write(tmp_path, """
[defaults]
weight = "gpu"

[weights]
gpu = 16
tiny = 0.5
light = 3
heavy = 8
playwright = 6
orchestrator = 12

[job_types.train]
command = ["python3", "train.py"]
weight = "tiny"
""")
    config = load_config(path)
    # Added to the defaults: subagent, never written, is still there.
    assert config.settings.weights == {"gpu": 16.0, "tiny": 0.5, "light": 3.0, "heavy": 8.0,
                                       "playwright": 6.0, "orchestrator": 12.0,
                                       "subagent": 0.0}
    assert config.settings.defaults.weight == "gpu"
    config.check_weight("tiny")
    config.check_weight("subagent")
    with pytest.raises(InputError, match="unknown weight 'huge'"):
        config.check_weight("huge")


# -- durations --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1h 30m 15s", 5415.0),
        ("250ms", 0.25),
        ("1m250ms", 60.25),
        ("1.5h", 5400.0),
        ("0.5s", 0.5),
        ("45", 45.0),
        ("0", 0.0),
        (" 10m ", 600.0),
        (90, 90.0),
        (2.5, 2.5),
        (0, 0.0),
    ],
)
def test_durations_parse(text, seconds):
    value = parse_duration(text)
    assert isinstance(value, float)
    assert value == seconds


@pytest.mark.parametrize(
    "junk",
    ["", "  ", "abc", "10x", "1d", "-5s", "-1", "m", "h", "ms", "30m1h", "1h30", "10 minutes",
     "nan", "inf", "-inf", "1e999", -1, -0.5, math.nan, math.inf, True, False, None, [10]],
)
def test_duration_junk_is_rejected(junk):
    with pytest.raises(ValueError, match=r"duration"):
        parse_duration(junk)


def test_durations_in_the_config_accept_strings_and_numbers(tmp_path):
    path = write(tmp_path, """
[runtime]
heartbeat_interval = 5
attempt_lease = "1m30s"
kill_grace = 2.5
poll_interval = "250ms"
""")
    runtime = load_config(path).settings.runtime
    assert (runtime.heartbeat_interval, runtime.attempt_lease, runtime.kill_grace,
            runtime.poll_interval) == (5.0, 90.0, 2.5, 0.25)


# -- errors name the file, the key and the line -----------------------------------------------

BAD_CONFIGS = {
    "unknown key": ("runtime.concurancy", """
[herder]
log_dir = "logs"

[runtime]
concurrency = 2
concurancy = 4  # <-
"""),
    "unknown section": ("runtim", """
[herder]
log_dir = "logs"
[runtim]  # <-
concurrency = 2
"""),
    "unknown top-level key": ("colour", """
colour = "blue"  # <-
[runtime]
concurrency = 2
"""),
    "unknown key in a job type": ("job_types.build.comand", """
[job_types.build]
command = ["make"]
comand = ["make"]  # <-
"""),
    "bad type": ("runtime.concurrency", """
[runtime]
poll_interval = "1s"
concurrency = "four"  # <-
"""),
    "out of range": ("defaults.max_attempts", """
[defaults]
priority = 5
max_attempts = 0  # <-
"""),
    "zero poll interval": ("runtime.poll_interval", """
[runtime]

poll_interval = "0s"  # <-
"""),
    "bad duration": ("job_types.build.timeout", """
[job_types.lint]
command = ["ruff", "check"]
timeout = "5m"

[job_types.build]
command = ["make"]
timeout = "30x"  # <-
"""),
    "command of the wrong type": ("job_types.build.command", """
[job_types.build]
weight = "heavy"
command = 5  # <-
"""),
    "empty command": ("job_types.build.command", """
[job_types.build]
command = []  # <-
"""),
    "missing command": ("job_types.build.command", """
[defaults]
priority = 1
[job_types.build]  # <-
weight = "heavy"
"""),
    "bad env name": ("job_types.build.env", """
[job_types.build]
command = ["make"]
env = { "NOT VALID" = "x" }  # <-
"""),
    "unknown weight in defaults": ("defaults.weight", """
[runtime]
concurrency = 2

[defaults]
priority = 5
weight = "enormous"  # <-
"""),
    "unknown weight in defaults, header with a comment": ("defaults.weight", """
[defaults]  # team defaults
priority = 5
weight = "enormous"  # <-
"""),
    "unknown weight in a job type": ("job_types.build.weight", """
[job_types.lint]
command = ["ruff"]
weight = "light"

[job_types.build]
command = ["make"]
weight = "enormous"  # <-
"""),
    "unknown weight in a dotted job type": ("job_types.build.weight", """
[job_types]
build.command = ["make"]
build.weight = "enormous"  # <-
"""),
    "a weight removed with false": ("job_types.build.weight", """
[weights]
light = 2
subagent = false

[job_types.build]
command = ["make"]
weight = "subagent"  # <-
"""),
    "shell with an argv list": ("job_types.build.command", """
[job_types.build]
shell = true
command = ["make", "all"]  # <-
"""),
    "string command without shell": ("job_types.build.command", """
[job_types.build]
command = "make all"  # <-
"""),
    "missing prompt file": ("job_types.agent.prompt_file", """
[job_types.agent]
command = ["claude", "-p", "{prompt}"]
prompt_file = "prompts/nope.md"  # <-
weight = "heavy"
"""),
}


@pytest.mark.parametrize(("key", "text"), BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_config_error_names_file_line_and_key(tmp_path, key, text):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert isinstance(raised.value, InputError)
    assert message.startswith(f"{path}:{marked_line(text)}: {key}: "), message
    assert "None" not in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "text",
    [
        "[runtime]\nconcurrency = 2\npoll_interval =   # <-\n",
        "[runtime]\nconcurrency = 2\nconcurrency = 3  # <-\n",
        "[runtime  # <-\nconcurrency = 2\n",
        '[job_types.x]\ncommand = ["a", "b"\n\n[defaults]  # <-\n',
    ],
    ids=["missing value", "duplicate key", "unclosed header", "unclosed array"],
)
def test_invalid_toml_names_file_and_line(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert message.startswith(f"{path}:{marked_line(text)}: invalid TOML: "), message


def test_removing_the_default_weight_names_defaults_weight(tmp_path):
    """`light = false` removes the implicit default "light": the load says which key."""
    path = write(tmp_path, "[weights]\ngpu = 16\nlight = false\n")
    message = refused(path)
    assert message.startswith(f"{path}: defaults.weight: unknown weight 'light'"), message
    assert "'gpu'" in message and "'heavy'" in message


def test_first_of_several_errors_is_reported_with_its_own_line(tmp_path):
    text = """
[runtime]
concurrency = 0  # <-

[defaults]
max_attempts = 0
"""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=rf":{marked_line(text)}: runtime\.concurrency: "):
        load_config(path)


def test_error_path_is_the_path_given(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    write(tmp_path, "[runtime]\nconcurrency = -1\n", "conf/team.toml")
    with pytest.raises(ConfigError) as raised:
        load_config("conf/team.toml")
    assert str(raised.value).startswith("conf/team.toml:2: runtime.concurrency: ")


# -- the database URL -------------------------------------------------------------------------


def config_with_db(tmp_path: Path, db: str | None) -> Config:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    line = f'db = "{db}"\n' if db is not None else ""
    return load_config(write(project, f"[herder]\n{line}"))


def test_db_defaults_to_herder_db_here(tmp_path):
    assert config_with_db(tmp_path, None).db_url() == DEFAULT_DB == "sqlite:///herder.db"
    assert load_config().db_url() == DEFAULT_DB


def test_relative_sqlite_path_in_config_resolves_against_the_config_directory(
    tmp_path, monkeypatch
):
    config = config_with_db(tmp_path, "sqlite:///data/queue.db")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    expected = (tmp_path / "project" / "data" / "queue.db").resolve()
    assert config.db_url() == f"sqlite:///{expected}"
    assert config.db_url().startswith("sqlite:////")


@pytest.mark.parametrize(
    "db", ["sqlite:////var/tmp/abs.db", "postgresql://herder@db.internal:5432/jobs"]
)
def test_absolute_and_postgres_urls_in_config_are_kept(tmp_path, db):
    assert config_with_db(tmp_path, db).db_url() == db


def test_db_precedence_override_then_env_then_config_then_default(tmp_path, monkeypatch):
    config = config_with_db(tmp_path, "sqlite:///from-config.db")
    from_config = f"sqlite:///{(tmp_path / 'project' / 'from-config.db').resolve()}"
    assert config.db_url() == from_config
    monkeypatch.setenv("HERDER_DB", "sqlite:///from-env.db")
    # The environment's relative path is the caller's (cwd), not the config's.
    assert config.db_url() == "sqlite:///from-env.db"
    assert config.db_url("postgresql://u@h/override") == "postgresql://u@h/override"
    assert config.db_url("sqlite:///flag.db") == "sqlite:///flag.db"
    monkeypatch.delenv("HERDER_DB")
    assert config.db_url() == from_config
    assert config_with_db(tmp_path, None).db_url() == DEFAULT_DB


def test_log_dir_resolves_against_the_config_directory(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    config = load_config(write(project, '[herder]\nlog_dir = "logs/here"\n'))
    assert config.log_dir == project.resolve() / "logs" / "here"


def shell_type(path: Path, script: str) -> Config:
    path.write_text("[job_types.say]\nshell = true\ncommand = " + json.dumps(script) + "\n")
    return load_config(path)


@pytest.mark.parametrize(("script", "says"), [
    ("echo '{msg}'", "{msg} on line 1 is inside single quotes"),
    ("cat <<'EOF'\n{msg}\nEOF", "{msg} on line 2 is inside a quoted heredoc"),
    ("eval echo {msg}", "used with `eval`"),
    ('bash -c "echo {msg}"', "in the word after `-c`"),
    ("sh -c 'x' && sh -c \"$(echo {msg})\"", "used with `sh`"),
    ("ssh build.example cat {msg}", "used with `ssh`"),
    ("sudo -u bob ls {msg}", "used with `sudo`"),
    ("su -c ls {msg}", "used with `su`"),
    ("echo {msg} | xargs ls", "used with `xargs`"),
    ("true\n. ./lib.sh {msg}", "{msg} on line 2 is used with `.`"),
    ("source ./lib.sh {msg}", "used with `source`"),
    ("exec /bin/bash <<EOF\necho {msg}\nEOF", "{msg} on line 2 is used with `bash`"),
    ("cat <<EOF | sh\n{msg}\nEOF", "a pipe into `sh`"),
    ("echo {msg} | /usr/bin/python3", "a pipe into `python3`"),
    ('python3 -c "print(\'{msg}\')"', "in the word after `-c`"),
    ("awk \"/{msg}/\" f", "used with `awk`"),
    ("python3 tool.py --title={msg}", "used with `python3` (not a whole argument"),
    ("bash -c {msg}", "in the word after `-c`"),
    ("node -e {msg} x", "in the word after `-e`"),
    ("echo ${msg}", "follows a '$'"),
    ("echo \\{msg}", "follows a backslash"),
    ("echo {a} {A}", "{a} and {A} would both be $HERDER_P_A"),
    ("{tool} --version", "{tool} on line 1 is in a command's place"),
    ("cd /srv && {tool} x", "in a command's place"),
    ("echo $({tool})", "in a command's place"),
    # handed to a shell by an option, whatever the program (issue 23 review)
    ('flock /tmp/l -c "echo {title}"', "{title} on line 1 is in the word after `-c`"),
    ('env -S "{x}"', "in the word after `-S`"),
    ('git rebase -x "make {t}"', "in the word after `-x`"),
    ('rsync -e "ssh {x}" a b', "in the word after `-e`"),
    ('echo "{x}" | at now', "used with `at`"),
    ('tmux new -d "vim {f}"', "used with `tmux`"),
    ("screen -dm vim {f}", "used with `screen`"),
    ("sg staff make {t}", "used with `sg`"),
    ("setsid make {t}", "used with `setsid`"),
    ("nsenter -t 1 -m ls {d}", "used with `nsenter`"),
    ("unshare -r ls {d}", "used with `unshare`"),
    ("chroot /srv/root ls {d}", "used with `chroot`"),
    # a command's place after a reserved word, an assignment or a wrapper
    ("if true; then {cmd} {arg}; fi", "{cmd} on line 1 is in a command's place"),
    ("while true; do\n  {cmd}\ndone", "{cmd} on line 2 is in a command's place"),
    ("exec {cmd}", "in a command's place"),
    ("timeout 5 {cmd}", "in a command's place"),
    ("timeout -s KILL 5 {cmd} x", "in a command's place"),
    ("nohup nice -n 5 {cmd}", "in a command's place"),
    ("env -u HOME X=1 {cmd}", "in a command's place"),
    ("X=1 {cmd}", "in a command's place"),
    ("! {cmd}", "in a command's place"),
    ('command "{cmd}"', "in a command's place"),
    ("stdbuf -oL ./run-{name}.sh", "in a command's place"),
    ("echo `{cmd}`", "in a command's place"),
    # bash's arithmetic contexts evaluate a[$(cmd)] in the value
    ("[[ {n} -gt 3 ]] && echo big", "{n} on line 1 is in an arithmetic context"),
    ('echo "$(( 1 + {n} ))"', "in an arithmetic context"),
    ("(( {n} ))", "in an arithmetic context"),
    ("let x={n}", "in an arithmetic context"),
    ("declare -i n={n}", "in an arithmetic context"),
    ("typeset -ri n={n}", "in an arithmetic context"),
    ("f() {{ local -i n={n}; }}", "in an arithmetic context"),
    ('echo "${{HOME:{n}}}"', "in an arithmetic context"),
    ("a[{n}]=1", "in an arithmetic context"),
])
def test_a_shell_placeholder_where_it_would_be_code_is_refused_at_load(tmp_path, script, says):
    """The lexical check of herder.core.shell_templates: each construct that evaluates text."""
    with pytest.raises(ConfigError) as error:
        shell_type(tmp_path / "herder.toml", script)
    assert "job_types.say: command:" in str(error.value)
    assert says in str(error.value)


@pytest.mark.parametrize("script", [
    "echo {msg} | tr a b",
    'echo "title: {msg}" > out.txt',
    "cat <<EOF > prompt.md\nFix: {msg}\nEOF\nclaude -p \"$(cat prompt.md)\"",
    "git log -- {msg} # don't {msg}",
    "python3 tools/run.py --title {msg} {msg}",
    "bash ./build.sh {msg}",
    'sh -c \'printf "%s" "$1"\' sh {msg}',
    "echo ${{HOME}} $(basename {msg})",
    "nohup ./tool {msg}",
    "timeout 5 ./tool {msg}",
    "env X=1 ./tool {msg}",
    "if test -n {msg}; then echo {msg}; fi",
    'echo "`basename {msg}`"',
    "X={msg} ./tool",
    "echo if {msg}",
    "wc -c -- {msg}",
    "[ {msg} = x ] && echo same",
])
def test_a_shell_placeholder_used_as_a_value_loads(tmp_path, script):
    assert shell_type(tmp_path / "herder.toml", script).settings.job_types["say"].shell


@pytest.mark.parametrize(("text", "says"), [
    ('command = ["ls"]\nworkdir = "{repo}"\n', 'set workdir_base = "/srv/checkouts"'),
    ('command = ["ls"]\nworkdir = "/x/{repo}"\nworkdir_base = "srv"\n',
     "workdir_base: 'srv' must be an absolute path"),
    ('command = ["ls"]\nrepositories = ["https://github.com/acme/"]\n',
     "repositories: limits a workspace's repository"),
    ('command = ["ls"]\nrepositories = ["https://github.com/a/../b/"]\n'
     'workspace = { repository = "{repo}", ref = "main" }\n',
     "repositories.0: 'https://github.com/a/../b/' has an empty, '.', '..'"),
    ('command = ["ls"]\noption_fields = ["a-b"]\n', "'a-b' is not a payload field name"),
])
def test_a_payload_target_without_its_bounds_is_refused_at_load(tmp_path, text, says):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, "[job_types.t]\n" + text))
    assert "job_types.t" in str(error.value)
    assert says in str(error.value)


@pytest.mark.parametrize(("command", "says"), [
    ('["sh", "-c", "echo {msg}"]', "command.2: {msg} is inside the code text of `sh -c`"),
    ('["/usr/bin/env", "python3", "-c", "print({msg!r})"]', "not a plain name"),
    ('["python3", "tool.py", "--title", "{a}", ["--tag={b}"]]', None),
    ('["node", "-e", "x", ["--eval", "run({a})"]]', "command.3.1: {a} is inside"),
    ('["ssh", "build", "make", "{target}"]', "command.3: {target} is an argument of `ssh`"),
    ('["su", "-c", "ls {d}", "bob"]', "an argument of `su`"),
    ('["{tool}", "x"]', "command.0: {tool} would let the payload choose the program"),
    ('["/opt/{tool}/bin/run"]', "command.0: {tool} would let"),
    ('["flock", "/tmp/l", "-c", "{cmd}"]', "command.3: {cmd} is inside the code text of `flock"),
    ('["env", "-S", "run {x}"]', "command.2: {x} is inside the code text of `env -S`"),
    ('["git", "-c", "{cfg}", "log"]', "command.2: {cfg} is inside the code text of `git -c`"),
    ('["unshare", "-r", "--", "sh", "-c", "ls {d}"]', "command.5: {d} is inside"),
    ('["tmux", "new", "-d", "vim {f}"]', "command.3: {f} is an argument of `tmux`"),
    ('["sg", "staff", "make {t}"]', "an argument of `sg`"),
    ('["at", "{when}"]', "an argument of `at`"),
    ('["env", "X=1", "{cmd}"]', "command.2: {cmd} would let the payload choose the program"),
    ('["timeout", "5", "{cmd}"]', "command.2: {cmd} would let"),
    ('["nice", "-n", "5", ["{cmd}"]]', "command.3.0: {cmd} would let"),
    ('["chroot", "/srv/root", "{cmd}"]', "command.2: {cmd} would let"),
    ('["setsid", "{cmd}"]', "command.1: {cmd} would let"),
    ('["timeout", "5", "pytest", "{path}"]', None),
    ('["chroot", "/srv/root", "ls", "{d}"]', None),
    ('["head", "-c", "{n}", "f"]', None),
])
def test_an_argv_item_that_an_interpreter_runs_as_code_is_refused(tmp_path, command, says):
    """An argv list never meets a shell, unless it starts one: the item after `sh -c`
    is a script, and ssh joins its arguments into the remote shell's command line."""
    path = write(tmp_path, f"[job_types.t]\ncommand = {command}\n")
    if says is None:
        assert load_config(path).settings.job_types["t"].command
        return
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert says in str(error.value)


def test_an_argv_value_passed_as_its_own_argument_to_sh_loads(tmp_path):
    path = write(tmp_path, '[job_types.t]\ncommand = ["sh", "-c", "echo \\"$1\\"", "sh", '
                           '"{msg}"]\n')
    assert load_config(path).settings.job_types["t"].command[-1] == "{msg}"


def test_a_templated_workdir_with_its_base_and_a_fixed_one_without_load(tmp_path):
    config = load_config(write(tmp_path, '[job_types.t]\ncommand = ["ls"]\nworkdir = "{repo}"\n'
                                         'workdir_base = "/srv/checkouts"\n'
                                         '[job_types.u]\ncommand = ["ls"]\nworkdir = "/srv"\n'))
    assert config.settings.job_types["t"].workdir_base == "/srv/checkouts"
    assert config.settings.job_types["u"].workdir_base is None


def test_export_of_a_field_that_cannot_be_an_environment_name_is_rejected(tmp_path):
    path = tmp_path / "herder.toml"
    path.write_text('[job_types.x]\ncommand = ["true"]\nexport = ["my-field"]\n')
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert ":3: job_types.x.export" in str(error.value)


def test_custom_weights_beside_the_default_chain_load(tmp_path):
    path = tmp_path / "herder.toml"
    path.write_text('[defaults]\nweight = "small"\n[weights]\nsmall = 1\nbig = 4\n')
    assert load_config(path).settings.weights == {**Settings().weights,
                                                  "small": 1.0, "big": 4.0}
    path.write_text('[weights]\nlight = 1\n[fleet]\nescalation = ["light", "huge"]\n')
    with pytest.raises(ConfigError, match=r"fleet\.escalation"):
        load_config(path)


def test_durations_longer_than_a_year_are_rejected():
    with pytest.raises(ValueError, match="longer than a year"):
        parse_duration("99999999h")


def test_the_samples_commented_fleet_section_is_real_config(tmp_path):
    """Uncommenting the documented [fleet], [server], [hosts.*] and [hooks] keys must give a
    config that loads, so the sample never documents a key that does not exist."""
    text = sample_config()
    head, _, tail = text.partition("# --- A fleet")
    lines = [line[2:] if line.startswith("# ") and ("=" in line or line.startswith("# ["))
             else "" for line in tail.splitlines()]
    for name in ("server.crt", "server.key"):
        (tmp_path / name).write_text("x")
    path = tmp_path / "herder.toml"
    path.write_text(head + "\n".join(lines))
    settings = load_config(path).settings
    assert settings.hosts["bms-4"].night.max_weight == "orchestrator"
    assert settings.fleet.shedding[0] == (0.75, None)
    assert settings.server.public_url == "https://coordinator:8470"
    assert settings.hooks.sources["github"].rules[0].payload == {"name": "{sender.login}"}


def test_unknown_weight_in_shedding_is_rejected(tmp_path):
    path = tmp_path / "herder.toml"
    path.write_text('[fleet]\nshedding = [[0.5, "huge"]]\n')
    with pytest.raises(ConfigError, match=r"fleet\.shedding"):
        load_config(path)


# -- [weights] merges over the defaults (issue 24) ---------------------------------------------


def test_one_weight_entry_keeps_the_others_and_the_default_chain(tmp_path):
    path = write(tmp_path, "[weights]\nlight = 0.25\n")
    settings = load_config(path).settings
    assert settings.weights == {**Settings().weights, "light": 0.25}
    assert settings.weights["heavy"] == Settings().weights["heavy"]
    assert settings.fleet.escalation == list(ESCALATION_CHAIN)
    rules = OutcomeRules.from_settings(settings)
    assert rules.weights is not None
    assert rules.weights.chain == ESCALATION_CHAIN
    assert rules.weights.budget("light") == 0.25
    assert rules.weights.budget("orchestrator") == 12.0


def test_an_override_changes_only_its_own_budget(tmp_path):
    path = write(tmp_path, "[weights]\nheavy = 10\n")
    weights = load_config(path).settings.weights
    assert weights["heavy"] == 10.0
    assert {k: v for k, v in weights.items() if k != "heavy"} == {
        k: v for k, v in Settings().weights.items() if k != "heavy"}


def test_false_removes_a_weight(tmp_path):
    path = write(tmp_path, "[weights]\nsubagent = false\n")
    weights = load_config(path).settings.weights
    assert "subagent" not in weights
    assert set(weights) == set(Settings().weights) - {"subagent"}


def test_a_removed_weight_in_the_default_chain_is_refused_naming_the_key(tmp_path):
    path = write(tmp_path, "[weights]\nplaywright = false\n")
    message = refused(path)
    assert message.startswith(f"{path}: fleet.escalation: unknown weight 'playwright'"), message
    assert "default escalation chain" in message


def test_a_removed_weight_in_a_written_chain_is_refused_naming_its_line(tmp_path):
    text = """
[weights]
playwright = false

[fleet]
escalation = ["light", "heavy", "playwright"]  # <-
"""
    path = write(tmp_path, text)
    message = refused(path)
    assert message.startswith(
        f"{path}:{marked_line(text)}: fleet.escalation: unknown weight 'playwright'"), message
    path.write_text('[weights]\nplaywright = false\n[fleet]\n'
                    'escalation = ["light", "heavy", "orchestrator"]\n')
    assert "playwright" not in load_config(path).settings.weights


def test_a_removed_weight_in_the_default_shedding_is_refused_naming_the_key(tmp_path):
    # heavy is in the default chain and shedding; a written chain without it leaves shedding.
    path = write(tmp_path, '[weights]\nheavy = false\n[fleet]\n'
                 'escalation = ["light", "playwright", "orchestrator"]\n')
    with pytest.raises(ConfigError, match=r"fleet\.shedding: unknown weight 'heavy' in the "
                                          r"default shedding steps"):
        load_config(path)


def test_a_removed_weight_used_by_a_job_type_is_refused(tmp_path):
    text = """
[weights]
subagent = false

[job_types.helper]
command = ["true"]
weight = "subagent"  # <-
"""
    path = write(tmp_path, text)
    assert refused(path).startswith(
        f"{path}:{marked_line(text)}: job_types.helper.weight: unknown weight 'subagent'")


@pytest.mark.parametrize(("text", "needle"), [
    ("[weights]\ngpu = false  # <-\n", "not a default weight"),
    ("[weights]\nlight = true  # <-\n", "use a number, or false"),
])
def test_weight_false_on_an_unknown_name_and_true_are_refused(tmp_path, text, needle):
    path = write(tmp_path, text)
    message = refused(path)
    assert message.startswith(f"{path}:{marked_line(text)}: weights."), message
    assert needle in message
